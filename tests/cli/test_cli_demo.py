"""`kerasnorm demo`: end to end through the command's entry point, and its
refusals and failure paths in process.

The end-to-end test recomputes what the report claims from the artifacts
themselves (the `.keras` file, the SavedModel, each `.tflite` run with
LiteRT) on the same held-out digits, so a report that misstates a number
fails it.
"""

import argparse
import json
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from kerasnorm.cli import demo
from kerasnorm.cli.demo import report as demo_report
from kerasnorm.cli.demo import run as demo_run
from kerasnorm_cli import command as main
from tests.cli import quick_demo

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snapshot(directory):
    """Every file under `directory` with its bytes and modification time."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = (
                    f.read(),
                    os.stat(path).st_mtime_ns,
                )
    return found


def _artifact_outputs(path, x):
    """Outputs of an artifact, computed here, not by the demo."""
    import keras

    import kerasnorm  # noqa: F401  (registers the layers for load_model)
    from kerasnorm.export import litert

    if path.endswith(".keras"):
        model = keras.saving.load_model(path, safe_mode=True)
        return np.asarray(model.predict(x, verbose=0))
    if path.endswith(".tflite"):
        with open(path, "rb") as f:
            return litert.Runner(f.read()).predict(x)[0]
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    (name,) = serve.structured_input_signature[1]
    (out,) = serve(**{name: tf.constant(x)}).values()
    return out.numpy()


def _test_digits(model_name, seed=0):
    _, _, x_test, y_test = demo.load_digits(seed)
    return (x_test[..., 0] if model_name == "ln_lstm" else x_test), y_test


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    # `quick_demo.prepare` leaves a file of the user's and two leftovers of
    # an earlier run, which --force must replace. .ci/run checks the run it
    # makes from the wheel (KERASNORM_DEMO_RUN), else the test makes one.
    run = os.environ.get("KERASNORM_DEMO_RUN")
    if run is None:
        run = str(tmp_path)
        quick_demo.prepare(run)
        quick_demo.run(
            run,
            (sys.executable, "-m", "kerasnorm_cli"),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
    returncode, stdout, stderr = quick_demo.read(run)
    out = pathlib.Path(run) / "out"
    assert returncode == 0, stderr[-4000:]
    # No TensorFlow or absl log line (absl's "Importing a function ... with
    # ops with unsaved custom gradients", C++'s "W0000 ..."), on either stream.
    logged = re.findall(
        r"^(?:WARNING|INFO|ERROR):(?:absl|tensorflow):.*|^[IWEF]\d{4} .*",
        stdout + stderr,
        re.M,
    )
    assert logged == [], logged[:5]
    printed = stdout
    assert "the first epoch includes the XLA compile" in printed
    assert re.search(r"First epoch [0-9.]+ s \(with the XLA compile\)", printed)
    assert "BatchNorm folding: 1 folded (batch_normalization -> conv2d)" in printed
    assert (out / "notes.txt").read_text() == "mine\n"
    assert not [n for n in os.listdir(out) if n.startswith(".")], os.listdir(out)

    report = json.loads((out / "report.json").read_text())
    markdown = (out / "report.md").read_text()
    assert report["quick"] is True
    models = {m["name"]: m for m in report["models"]}
    assert set(models) == {"conv_net", "ln_lstm"}
    expected = {
        "conv_net": {
            "conv_net.keras",
            "conv_net/1",
            "conv_net.tflite",
            "conv_net.float16.tflite",
            "conv_net.int8.tflite",
            "conv_net.qat.int8.tflite",
        },
        "ln_lstm": {
            "ln_lstm.keras",
            "ln_lstm/1",
            "ln_lstm.tflite",
            "ln_lstm.float16.tflite",
            "ln_lstm.int8.tflite",
        },
    }
    for name, model in models.items():
        rows = {row["artifact"]: row for row in model["rows"]}
        assert set(rows) == expected[name]
        x_test, y_test = _test_digits(name)
        keras_logits = _artifact_outputs(str(out / f"{name}.keras"), x_test)
        keras_acc = float(np.mean(keras_logits.argmax(-1) == y_test))
        for artifact, row in rows.items():
            path = str(out / artifact)
            assert os.path.exists(path), path
            logits = _artifact_outputs(path, x_test)
            accuracy = float(np.mean(logits.argmax(-1) == y_test))
            assert row["test_accuracy"] == pytest.approx(accuracy, abs=1e-9), artifact
            assert f"`{artifact}`" in markdown
            assert f"{accuracy:.4f}" in markdown
            if artifact in (f"{name}/1", f"{name}.tflite"):
                scale = np.abs(keras_logits).max()
                diff = np.abs(logits - keras_logits).max()
                assert diff <= 1e-4 * scale, (artifact, diff)
                # The demo compared with the model in memory, here with the
                # reloaded file run in batches: float noise differs, not more.
                assert row["max_abs_diff"] <= 1e-4 * scale, (artifact, row)
            if ".int8." in artifact:
                assert accuracy >= keras_acc - 0.03, (artifact, accuracy, keras_acc)
        assert rows[f"{name}.keras"]["test_accuracy"] == pytest.approx(keras_acc)
        # What report.md says the tolerances are relative to: the max check's
        # error is the max abs diff over the largest |logit| it states.
        for row in rows.values():
            if row["reference"] == "Keras":
                relative = row["max_abs_diff"] / model["output_scale"]
                assert row["max_rel_diff"] == pytest.approx(relative, rel=1e-3)
            if row["reference"] is not None:
                # The check ran on the test digits, and report.md says so.
                assert row["checked_on"] == f"{len(x_test)} test digits", row
                assert f"on {len(x_test)} test digits: ok" in markdown
    assert "tolerances are relative to the output scale" in markdown
    assert os.path.isfile(out / "conv_net" / "1" / "saved_model.pb")


def test_refuses_a_non_empty_out_and_leaves_it_untouched(tmp_path, capsys):
    out = tmp_path / "results"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine\n")
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _snapshot(out)

    assert main(["demo", "--quick", "--out", str(out)]) == 2
    assert re.search(
        r"kerasnorm demo: error: --out '.*results' is not empty \(2 entries\).*"
        r"--force.*Nothing was written",
        capsys.readouterr().err,
    )
    assert _snapshot(out) == before
    assert sorted(os.listdir(out)) == ["notes.txt", "sub"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--epochs", "0"],
            r"argument --epochs: expected a positive integer\. Received: 0",
        ),
        (["--out", "{file}"], r"--out '.*taken' exists and is not a directory"),
    ],
)
def test_bad_arguments_exit_2_before_any_work(tmp_path, capsys, arguments, message):
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    arguments = [a.replace("{file}", str(taken)) for a in arguments]
    if "--out" not in arguments:
        arguments += ["--out", str(tmp_path / "new")]
    assert main(["demo", *arguments]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert taken.read_text() == "a file\n"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("error", "status"),
    [("ExportVerificationError", 1), ("ExportConversionError", 3)],
)
def test_a_failed_export_leaves_no_report(tmp_path, capsys, monkeypatch, error, status):
    from kerasnorm import export

    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.json").write_text("{}\n")
    (out / "report.md").write_text("# an earlier run\n")
    (out / "notes.txt").write_text("mine\n")

    def fail(args, budget):
        raise getattr(export, error)(f"{args.out}/conv_net.int8.tflite: broken")

    monkeypatch.setattr(demo_run, "conv_net_showcase", fail)
    assert main(["demo", "--quick", "--force", "--out", str(out)]) == status
    assert re.search(
        r"kerasnorm demo: error: .*conv_net\.int8\.tflite: broken",
        capsys.readouterr().err,
    )
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old\n")

    def write_half(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        demo_report.write_atomically(str(path), write_half)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["report.md"]


def test_without_the_qat_extra_the_qat_row_is_left_out_with_a_note(monkeypatch, capsys):
    from kerasnorm import export

    def missing_extra(model, **kwargs):
        raise ImportError(
            "Quantization-aware training needs tensorflow-model-optimization "
            "and tf-keras: install kerasnorm's `qat` extra"
        )

    monkeypatch.setattr(export, "quantize_aware", missing_extra)
    args = argparse.Namespace(out="unused", seed=0, force=False, verbose=False)
    row, note = demo_run.qat_int8_row(None, demo.load_digits(0), args, demo_run.QUICK)
    assert row is None
    assert re.fullmatch(r"QAT int8 skipped: .*install kerasnorm's `qat` extra", note)
    assert note in capsys.readouterr().out
