"""A `.tflite` file LiteRT aborts on is an error, not the end of the
caller's process: its first load and run happen in a child process
(`verify.child`). The real crasher (an int8 file that aborts in
`allocate_tensors`) and a child made to abort at each step are tried; the
caller carries on, and nothing is left beside the target."""

import os
import pathlib
import re

import keras
import numpy as np
import pytest

from kerasnorm.export import ExportVerificationError
from kerasnorm.export import to_tflite
from kerasnorm.export.verify import child
from kerasnorm_cli import command as main
from kerasnorm_cli.exits import EXIT_OK
from kerasnorm_cli.exits import EXIT_PARITY

pytestmark = pytest.mark.tf_only

DATA = pathlib.Path(__file__).parent / "data"
L = keras.layers


def _tiny():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), name="x")
    return keras.Model(inputs, L.Dense(2)(L.LayerNormalization()(L.Dense(4)(inputs))))


@pytest.fixture
def aborting_child(monkeypatch):
    """The session's child replaced by one that aborts (SIGABRT) when it
    reaches `step`; the real one back afterwards."""

    def at(step):
        source = child.CHILD_SOURCE.replace(
            f'step("{step}")\n', f'step("{step}")\n        import os; os.abort()\n'
        )
        assert source != child.CHILD_SOURCE
        monkeypatch.setattr(child, "CHILD_SOURCE", source)
        child.kept.close()

    yield at
    child.kept.close()


def test_the_file_that_aborts_litert_is_an_error():
    x = np.random.default_rng(0).normal(size=(2, 32, 1)).astype("float32")
    with pytest.raises(ExportVerificationError) as caught:
        child.first_run(DATA / "abort_on_allocate.int8.tflite", {"input_0": x})
    first = str(caught.value).splitlines()[0]
    assert "at the allocate step" in first and "SIGABRT" in first
    assert "XNNPACK" in first and "Next step: export with quantize=" in first
    # This process is alive, and the next file runs in a new child.
    with pytest.raises(ExportVerificationError, match="again"):
        child.first_run(DATA / "abort_on_allocate.int8.tflite", {"input_0": x}, "again")


@pytest.mark.parametrize("step", ["allocate", "invoke"])
def test_export_whose_first_run_aborts(tmp_path, aborting_child, step):
    aborting_child(step)
    model = _tiny()
    x = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    target = tmp_path / "m.tflite"
    with pytest.raises(ExportVerificationError) as caught:
        to_tflite(model, target, verify_inputs=x)
    first = str(caught.value).splitlines()[0]
    assert f"at the {step} step of {target}" in first and "SIGABRT" in first
    assert os.listdir(tmp_path) == []  # no staged file left


def test_cli_exit_status_on_a_crash(tmp_path, aborting_child, capsys):
    model = _tiny()
    model.save(tmp_path / "m.keras")
    original = child.CHILD_SOURCE
    aborting_child("allocate")
    out = tmp_path / "out"
    code = main(["export", str(tmp_path / "m.keras"), "--out", str(out), "--tflite"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == EXIT_PARITY, text
    assert "allocate step" in text and "SIGABRT" in text
    assert not out.exists() or os.listdir(out) == []
    child.kept.close()
    child.CHILD_SOURCE = original  # the process carries on: the next export works
    code = main(["export", str(tmp_path / "m.keras"), "--out", str(out), "--tflite"])
    assert code == EXIT_OK, capsys.readouterr().out


def test_an_error_litert_raises_is_left_to_the_callers_run(tmp_path):
    """Not a crash: the child answers with LiteRT's error, and the caller's
    own run (`litert.Runner`) raises it with its message."""
    from kerasnorm.export import litert

    path = tmp_path / ".m.tflite.tmp-123-0a1b2c3d.tflite"
    path.write_bytes(litert.convert(_tiny()))
    assert child.staged_target(path) == str(tmp_path / "m.tflite")
    assert child.first_run(path, {"x": np.ones((2, 6), "float32")}) is None
    wrong = child.first_run(path, {"x": np.ones((2, 5), "float32")})
    assert wrong is not None and "Error" in wrong


@pytest.mark.slow
def test_a_kernel_litert_cannot_prepare_is_a_failed_check(tmp_path, monkeypatch):
    """A random graph of the fuzzer whose int16x8 file LiteRT refuses when
    it allocates (a kernel's RuntimeError, not a crash): an
    ExportVerificationError naming the step and the node's layer, nothing
    written. Its cause, a LayerNorm over one channel, is now refused before
    the file runs (`tflite.degenerate`, and its zero-range tensors by
    `tflite.int16`); those refusals are switched off here so that LiteRT's
    own is what the guard meets."""
    from export.fuzz_export import sequence_graph
    from kerasnorm.export.tflite import write

    monkeypatch.setattr(write, "refuse_self_squares", lambda *args: None)
    monkeypatch.setattr(write, "refuse_zero_scales", lambda *args: None)
    model, x, _ = sequence_graph(1010)
    with pytest.raises(ExportVerificationError) as caught:
        to_tflite(
            model,
            tmp_path / "m.tflite",
            quantize="int16x8",
            representative_data=x,
            verify_inputs=x,
            calibration_samples=len(x),
        )
    first = str(caught.value).splitlines()[0]
    assert "(step allocate, delegate XNNPACK" in first and "Next step" in first
    assert re.search(r"Node \d+ \(\w+\) is computed by layer '", first), first
    assert os.listdir(tmp_path) == []
