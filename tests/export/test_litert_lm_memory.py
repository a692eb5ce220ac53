"""An export's memory against its model's float32 weights, and the file
holding each weight once however many signatures read it.

Measured in a child process (its own high-water mark, `VmHWM`, reset once
the model is built: the test process's baseline and the model itself do not
count), on a model large enough that its weights, not TensorFlow's fixed
overhead, decide the figure: a `LlamaCausalLM` of 44 MB of float32 weights.
Before the signatures shared one module's variables, each was frozen on its
own (every weight copied per signature, then again in the SavedModel):
such an export of the 78 MB medium Llama took 4.7 GiB above the built
model, 65x its weights; then 0.55 GiB, 7.5x. This one: 72x before, 8.5x
then, and 5.8x since its kernels and table are kept out of the converter
(`litert_lm.weight_inputs`: every one of them is 1 MiB or more).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.export import lm_models

pytestmark = pytest.mark.tf_only
# The child builds keras-hub's LlamaCausalLM (the oldest-stack pass has none).
pytest.importorskip("keras_hub")

CONFIG = lm_models.LM_SHAPES["small"]
# The export's own peak over the float32 weight bytes: 65x before the
# signatures shared their weights, ~10x with the weights in the converter,
# ~6x now at this size, most of it TensorFlow's and the converter's fixed
# cost.
MAX_RATIO = 10.0

CHILD = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from tests.export.lm_models import causal_lm
from kerasnorm.export import to_litert_lm

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

model = causal_lm("llama", seed=0, **json.loads(sys.argv[1]))
weights = sum(4 * int(w.numpy().size) for w in model.weights)
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
result = to_litert_lm(model, sys.argv[2], max_sequence_length=64,
                      prefill_lengths=(8, 16))
print("RESULT " + json.dumps({
    "weights": weights, "before": before, "peak": status("VmHWM"),
    "size": result.size_bytes, "signatures": list(result.signatures),
}))
"""


def _peak_reset_allowed():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    if not _peak_reset_allowed():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak")
    path = tmp_path_factory.mktemp("memory") / "model.tflite"
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CONFIG), str(path)],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=600,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_the_export_peak_is_bounded_by_the_weights(measured):
    ratio = (measured["peak"] - measured["before"]) / measured["weights"]
    assert measured["weights"] > 40e6
    assert 0 < ratio <= MAX_RATIO, measured


def test_the_file_holds_each_weight_once(measured):
    # Three signatures read every weight: one copy each would be ~3x.
    assert measured["signatures"] == ["prefill_8", "prefill_16", "decode"]
    assert 0.9 <= measured["size"] / measured["weights"] <= 1.1, measured


def test_weights_after_the_flatbuffer_generate_the_same(tmp_path, monkeypatch):
    """Past `BUFFER_OFFSET_BYTES` the weights go after the flatbuffer (the
    way past its 2 GB limit): the file is checked by generating as any
    other and gives the same logits as the plain one."""
    import numpy as np

    from kerasnorm.export import to_litert_lm
    from kerasnorm.export.litert.generator import Generator
    from kerasnorm.export.litert_lm import write
    from tests.export.lm_models import kerasnorm_decoder

    model = kerasnorm_decoder()
    plain = to_litert_lm(model, tmp_path / "plain.tflite", max_sequence_length=16)
    monkeypatch.setattr(write, "BUFFER_OFFSET_BYTES", 0)
    after = to_litert_lm(model, tmp_path / "after.tflite", max_sequence_length=16)
    contents = [open(r.path, "rb").read() for r in (plain, after)]
    assert b"buffer_location" in contents[1]
    assert b"buffer_location" not in contents[0]
    assert after.signatures == plain.signatures
    logits = [Generator(c).prefill([3, 5, 7]) for c in contents]
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.parametrize("mode", ["dynamic", "int4"])
def test_weights_after_the_flatbuffer_are_quantized(tmp_path, monkeypatch, mode):
    """The weights pass reads weights stored by offset, as views into the
    file, and writes its own after the flatbuffer: the same integers as
    the plain file's pass, the same logits."""
    import numpy as np

    from kerasnorm.export import to_litert_lm
    from kerasnorm.export.litert.generator import Generator
    from kerasnorm.export.litert_lm import write
    from kerasnorm.export.weights.quantize import quantize_weights
    from tests.export.lm_models import kerasnorm_decoder

    model = kerasnorm_decoder()
    plain = to_litert_lm(model, tmp_path / "plain.tflite", max_sequence_length=16)
    monkeypatch.setattr(write, "BUFFER_OFFSET_BYTES", 0)
    after = to_litert_lm(model, tmp_path / "after.tflite", max_sequence_length=16)
    contents = [
        quantize_weights(open(r.path, "rb").read(), mode, fallbacks=[])
        for r in (plain, after)
    ]
    assert b"buffer_location" in contents[1]
    assert b"buffer_location" not in contents[0]
    # Quantized, not left float: within alignment padding of the plain file.
    assert abs(len(contents[1]) - len(contents[0])) < 64 * 64, [
        len(c) for c in contents
    ]
    logits = [Generator(c).prefill([3, 5, 7]) for c in contents]
    np.testing.assert_array_equal(logits[0], logits[1])
