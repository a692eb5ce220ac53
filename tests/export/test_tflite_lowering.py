"""A float32 `.tflite` file holds the norms' float32 graph
(`kerasnorm/_core/lowering.py`, traced by `tflite/write.py`); the fast int8
file takes GroupNorm's statistics the same way; every other mode keeps the
core's graph, whose statistics the quantizers find.

Each file is run with LiteRT and compared with the Keras model (outside the
lowering), at two batch sizes for a dynamic-batch file."""

import contextlib

import keras
import numpy as np
import pytest

import kerasnorm
from export import models
from kerasnorm.export import litert
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

SIDE = 12
# The run-time shape arithmetic XNNPACK does not delegate.
SHAPE_OPS = {"SHAPE", "GATHER", "REDUCE_PROD", "PACK", "CONCATENATION", "STRIDED_SLICE"}


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
    "LayerNorm(center=False)": lambda: kerasnorm.LayerNorm(center=False),
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
    "RMSNorm": (None, 0, None),  # a gain alone stays a MUL
    "RMSNorm(center)": ("DEPTHWISE_CONV_2D", 1, None),
    "LayerNorm(center=False)": (None, 0, None),
    "LayerNorm(scale=False)": (None, 0, None),  # an offset alone stays an ADD
    # Its gain folds into the per-channel statistics: the core's graph.
    "InstanceNorm": (None, 0, None),
}


# The norms whose affine folds into the next layer in a float32 file
# (`fold.affine`: a gain alone passes the ReLU, an offset does not): one
# `MUL` fewer per norm than the float16 file, which keeps the norms whole.
GAIN_FOLDED = {"RMSNorm", "LayerNorm(center=False)"}


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
    folded = 2 if norm in GAIN_FOLDED else 0
    assert len(result.fold_report.affines) == folded, result.fold_report
    if added is None and removed is None:
        assert ops == {**core_ops, "MUL": core_ops["MUL"] - folded}, (ops, core_ops)
    # No shape arithmetic, at a dynamic batch too: one XNNPACK partition.
    assert not SHAPE_OPS & set(ops), ops
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
    if norm == "GroupNorm" and quantize == "dynamic":
        assert ops.get("RESHAPE", 0) > 0
    if norm == "GroupNorm" and quantize == "int8":
        # The fast int8 file takes the float32 file's channel-space
        # statistics (tests/export/test_tflite_int8_group_norm.py): two
        # group products per norm and the head.
        assert ops["FULLY_CONNECTED"] == 2 * 2 + 1, ops
    v = result.verification
    error = v.max_rel_error if v.criterion == "max" else v.rms_rel_error
    assert error <= v.tolerance


TOKEN_NORMS = {
    "LayerNorm": kerasnorm.LayerNorm,
    "RMSNorm": kerasnorm.RMSNorm,
    "none": lambda: keras.layers.Identity(),
}


def _token_model(norm, sample_shape):
    """Dense -> norm -> Dense(relu) -> Dense + residual -> norm, on tokens of
    `sample_shape` (time, C) or a grid (H, W, C); its norms random."""
    inputs = keras.Input(sample_shape, name="tokens")
    x = keras.layers.Dense(8)(inputs)
    h = keras.layers.Dense(16, activation="relu")(norm()(x))
    x = norm()(x + keras.layers.Dense(8)(h))
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    models.randomize_norms(model, seed=4)
    return model


# Every norm in the float modes; the quantized modes with LayerNorm (their
# files' products are the same FULLY_CONNECTED).
TOKEN_CASES = [(norm, mode) for norm in TOKEN_NORMS for mode in (None, "float16")] + [
    ("LayerNorm", mode) for mode in ("dynamic", "int8", "int16x8")
]


def _token_export(model, path, x, quantize, batch_size, **kwargs):
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    if quantize in ("int8", "int16x8"):
        rng = np.random.default_rng(7)
        kwargs["representative_data"] = rng.standard_normal((32, *x.shape[1:]))
    if quantize is not None:
        # The quantization error of this small random model is what it is;
        # `test_the_one_product_quantizes_as_keras_product_does` compares it.
        kwargs["tolerance"] = float("inf")
    return to_tflite(model, path, verify_inputs=x, quantize=quantize, **kwargs)


@pytest.mark.parametrize("batch_size", [None, 2])
@pytest.mark.parametrize(
    "sample_shape", [(6, 5), (None, 5), (3, 4, 5)], ids=["time", "open-time", "grid"]
)
@pytest.mark.parametrize(("norm", "quantize"), TOKEN_CASES)
def test_dense_on_tokens_is_one_fully_connected(
    norm, quantize, sample_shape, batch_size, tmp_path
):
    """Every file writes each `Dense` on tokens as one `FULLY_CONNECTED`, at
    a dynamic batch and time too (`_compat.matmul_as_one_product`): no shape
    arithmetic, one XNNPACK partition (int16x8 runs on the builtin kernels);
    a float file matches the model at a batch and, where the time axis is
    open, a length of its own."""
    keras.utils.set_random_seed(0)
    model = _token_model(TOKEN_NORMS[norm], sample_shape)
    shape = tuple(4 if size is None else size for size in sample_shape)
    x = np.random.default_rng(2).standard_normal((4, *shape)).astype("float32")
    path = tmp_path / "tokens.tflite"
    result = _token_export(model, path, x, quantize, batch_size)
    content = path.read_bytes()
    ops = litert.op_counts(content)
    assert ops["FULLY_CONNECTED"] == 4, ops
    assert not SHAPE_OPS & set(ops), ops
    delegation = result.verification.delegation
    assert delegation.fully_delegated or quantize == "int16x8", result.verification
    if quantize not in (None, "float16"):
        return
    runner = litert.Runner(content)
    for n, length in ((batch_size or 1, None), (batch_size or 3, 7)):
        if length is not None and None not in sample_shape:
            length = None
        sample = (length, *shape[1:]) if length else shape
        inputs = (
            np.random.default_rng(n).standard_normal((n, *sample)).astype("float32")
        )
        (got,) = runner.predict(inputs)
        atol = 2e-5 if quantize is None else 2e-2
        np.testing.assert_allclose(got, np.asarray(model(inputs)), atol=atol, rtol=0)


@pytest.mark.parametrize("quantize", ["dynamic", "int8", "int16x8"])
def test_the_one_product_quantizes_as_keras_product_does(
    quantize, tmp_path, monkeypatch
):
    """A quantized file of the one product has the error of the file of
    Keras' own product (traced with the hook off: keras 3.15's
    `tensordot`), at a dynamic length."""
    from kerasnorm.export.tflite import write

    keras.utils.set_random_seed(0)
    model = _token_model(kerasnorm.LayerNorm, (None, 5))
    x = np.random.default_rng(2).standard_normal((4, 6, 5)).astype("float32")
    ours = _token_export(model, tmp_path / "one.tflite", x, quantize, None)
    monkeypatch.setattr(write, "matmul_as_one_product", contextlib.nullcontext)
    keras_own = _token_export(model, tmp_path / "keras.tflite", x, quantize, None)
    for name in ("rms_rel_error", "max_rel_error"):
        a, b = getattr(ours.verification, name), getattr(keras_own.verification, name)
        assert a <= 1.1 * b + 1e-3, (name, a, b)
