"""A float32 `.tflite` file holds the norms' float32 graph
(`kerasnorm/_core/lowering.py`, traced by `tflite/write.py`); every other
mode keeps the core's graph, whose statistics the quantizers find.

Each file is run with LiteRT and compared with the Keras model (outside the
lowering), at two batch sizes for a dynamic-batch file."""

import keras
import numpy as np
import pytest

import kerasnorm
from export import models
from kerasnorm.export import litert
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

SIDE = 12


def _conv_net(norm):
    """export/models.py's conv net (Conv2D -> norm -> ReLU, twice), its norms'
    gains and offsets random (the converter folds a gain of ones away)."""
    model = models.conv_net(norm, SIDE, widths=(8, 16))
    models.randomize_norms(model, seed=3)
    return model


NORMS = {
    "GroupNorm": lambda: kerasnorm.GroupNorm(4),
    "GroupNorm(-1)": lambda: kerasnorm.GroupNorm(-1),
    "LayerNorm": kerasnorm.LayerNorm,
    "RMSNorm": kerasnorm.RMSNorm,
    "RMSNorm(center)": lambda: kerasnorm.RMSNorm(center=True),
    "LayerNorm(scale=False)": lambda: kerasnorm.LayerNorm(scale=False),
    "InstanceNorm": kerasnorm.InstanceNorm,
}
# The float32 graph per norm: the op it adds (and how many per norm), the
# op it removes.
LOWERED = {
    # The group means' products (mean and var); the reshapes of the grouped
    # view are gone (those left shape the (batch, C) statistics).
    "GroupNorm": ("FULLY_CONNECTED", 2, None),
    "GroupNorm(-1)": (None, 0, "RESHAPE"),  # one channel per group: no product
    "LayerNorm": ("DEPTHWISE_CONV_2D", 1, None),
    "RMSNorm": ("DEPTHWISE_CONV_2D", 1, None),
    "RMSNorm(center)": ("DEPTHWISE_CONV_2D", 1, None),
    "LayerNorm(scale=False)": (None, 0, None),  # an offset alone stays an ADD
    # Its gain folds into the per-channel statistics: the core's graph.
    "InstanceNorm": (None, 0, None),
}


def _images(n, seed=0):
    return (
        np.random.default_rng(seed).uniform(0, 1, (n, SIDE, SIDE, 3)).astype("float32")
    )


def _export(model, tmp_path, name, **kwargs):
    path = tmp_path / f"{name}.tflite"
    result = to_tflite(model, path, verify_inputs=_images(8), **kwargs)
    return result, path.read_bytes()


@pytest.mark.parametrize("batch_size", [None, 1])
@pytest.mark.parametrize("norm", list(NORMS))
def test_the_float32_file_holds_the_lowered_graph(norm, batch_size, tmp_path):
    keras.utils.set_random_seed(0)
    model = _conv_net(NORMS[norm])
    result, content = _export(model, tmp_path, "f32", batch_size=batch_size)
    _, core = _export(model, tmp_path, "f16", quantize="float16", batch_size=batch_size)
    ops, core_ops = litert.op_counts(content), litert.op_counts(core)
    core_ops.pop("DEQUANTIZE")  # the float16 file's weights
    added, per_norm, removed = LOWERED[norm]
    # The core's graph: no depthwise op, the model's own Dense(10) the one
    # FULLY_CONNECTED; the float32 file adds `per_norm` for each of 2 norms.
    assert core_ops.get("DEPTHWISE_CONV_2D", 0) == 0
    assert core_ops["FULLY_CONNECTED"] == 1
    if added is not None:
        assert ops[added] - core_ops.get(added, 0) == 2 * per_norm, (ops, core_ops)
    if removed is not None:
        assert ops.get(removed, 0) == 0 < core_ops[removed], (ops, core_ops)
    if added is None and removed is None:
        assert ops == core_ops
    # No shape arithmetic, at a dynamic batch too: one XNNPACK partition.
    assert not {"SHAPE", "STRIDED_SLICE", "PACK", "CONCATENATION"} & set(ops), ops
    assert result.verification.delegation.fully_delegated, result.verification
    runner = litert.Runner(content)
    for n in (1,) if batch_size == 1 else (1, 3):
        x = _images(n, seed=n)
        (got,) = runner.predict(x)
        np.testing.assert_allclose(got, np.asarray(model(x)), atol=2e-5, rtol=0)


@pytest.mark.parametrize("quantize", ["dynamic", "int8"])
@pytest.mark.parametrize("norm", ["GroupNorm", "LayerNorm"])
def test_quantized_files_keep_the_core_graph(norm, quantize, tmp_path):
    keras.utils.set_random_seed(0)
    model = _conv_net(NORMS[norm])
    kwargs = {"representative_data": _images(32, seed=5)} if quantize == "int8" else {}
    result, content = _export(model, tmp_path, quantize, quantize=quantize, **kwargs)
    ops = litert.op_counts(content)
    assert "DEPTHWISE_CONV_2D" not in ops
    if norm == "GroupNorm":
        assert ops.get("RESHAPE", 0) > 0
    v = result.verification
    error = v.max_rel_error if v.criterion == "max" else v.rms_rel_error
    assert error <= v.tolerance
