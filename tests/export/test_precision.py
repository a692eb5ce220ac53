"""Exporting models built under mixed_float16 / mixed_bfloat16 (`numerics.precision`).

The layers' own mixed-precision behaviour is tests/norms/test_mixed_precision.py.
"""

import os

import keras
import numpy as np
import pytest

from kerasnorm import layers as kl
from kerasnorm.export import ExportConversionError
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.numerics import precision as mp
from kerasnorm.export.tflite.explain import explain
from kerasnorm_cli import command as main

# SavedModel and TFLite: TensorFlow programs.
pytestmark = pytest.mark.tf_only

POLICIES = ["mixed_float16", "mixed_bfloat16"]
SHAPE = (6, 6, 3)


def _build(policy, nested=False):
    """Conv+BN+ReLU -> GroupNorm -> Dense+LayerNorm -> Dense pinned to
    float32; `nested` puts the Dense+LayerNorm in a
    nested Sequential with a float32-pinned LayerNorm inside."""
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        x = keras.Input(SHAPE, name="image")
        y = keras.layers.Conv2D(4, 3, name="conv")(x)
        y = keras.layers.BatchNormalization(name="bn")(y)
        y = keras.layers.ReLU(name="relu")(y)
        y = kl.GroupNorm(groups=2, name="gn")(y)
        y = keras.layers.GlobalAveragePooling2D(name="pool")(y)
        if nested:
            inner = keras.Sequential(
                [
                    keras.Input((4,)),
                    keras.layers.Dense(5, name="inner_dense"),
                    kl.LayerNorm(name="inner_ln", dtype="float32"),
                ],
                name="inner",
            )
            y = inner(y)
        else:
            y = keras.layers.Dense(5, name="dense")(y)
            y = kl.LayerNorm(name="ln")(y)
        y = keras.layers.Dense(3, name="logits", dtype="float32")(y)
        model = keras.Model(x, y, name="net")
    finally:
        keras.config.set_dtype_policy(saved)
    rng = np.random.default_rng(1)
    bn = model.get_layer("bn")
    bn.set_weights(
        [
            rng.uniform(0.5, 1.5, 4),
            rng.normal(0, 0.3, 4),
            rng.normal(0, 0.3, 4),
            rng.uniform(0.5, 2.0, 4),
        ]
    )
    return model


def _inputs(n=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype("float32")


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


def _policies(model):
    return {layer.name: layer.dtype_policy.name for layer in mp.all_layers(model)}


def _rebuild(model, target="float32"):
    return mp.rebuild(model, target, layers=all_layers(model))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("nested", [False, True])
def test_copy_is_the_float32_model_with_the_same_weights(policy, nested):
    model = _build(policy, nested)
    before, policies = _weights(model), _policies(model)
    keras.config.set_dtype_policy(policy)  # as in a training script
    rebuilt = _rebuild(model)
    assert keras.config.dtype_policy().name == policy
    keras.config.set_dtype_policy("float32")

    assert rebuilt.policy == policy
    assert mp.half_precision_layers(rebuilt.copy) == []
    assert rebuilt.compute_dtype is None is mp.compute_dtype(rebuilt.copy)
    assert {p for p in _policies(rebuilt.copy).values()} == {"float32"}
    # The user's model: same policies, same weights, still half precision.
    assert _policies(model) == policies
    for a, b in zip(_weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)
    # Under a mixed policy the variables are float32: the copy holds them
    # exactly.
    for a, b in zip(_weights(rebuilt.copy), before, strict=True):
        np.testing.assert_array_equal(a, b)
    # Independent reference: the same architecture built under float32 with
    # those weights. Two graphs of the same float32 ops; 1e-6 allows a
    # different kernel choice between them.
    reference = _build("float32", nested)
    reference.set_weights(before)
    x = _inputs()
    np.testing.assert_allclose(
        np.asarray(rebuilt.copy(x)), np.asarray(reference(x)), rtol=0, atol=1e-6
    )


def test_half_layers_are_named_float32_pinned_ones_are_not():
    model = _build("mixed_float16", nested=True)
    # inner_ln and logits are pinned to float32; the nested model itself and
    # the Input compute nothing.
    assert mp.half_precision_layers(model) == [
        "conv",
        "bn",
        "relu",
        "gn",
        "pool",
        "inner_dense",
    ]
    assert mp.compute_dtype(model) == "float16"
    assert mp.compute_tolerance(model) == pytest.approx(2.0**-11 * 8 * 6)
    assert _rebuild(_build("float32")) is None


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("target", ["float32", "float16"])
def test_a_rebuild_states_its_copy_s_compute_dtype(policy, target):
    rebuilt = _rebuild(_build(policy, nested=True), target)
    assert rebuilt.compute_dtype == mp.compute_dtype(rebuilt.copy)
    assert rebuilt.compute_dtype == (None if target == "float32" else "float16")


@pytest.mark.parametrize("policy", POLICIES)
def test_compute_tolerance_covers_measured_error(policy):
    """The compute tolerance's depth factor, measured: the half-precision
    model against its float32 copy stays within 4 roundoffs per layer (half
    of what `compute_tolerance` allows; 3.25 at worst over 10 seeds) on
    random models and inputs."""
    worst = 0.0
    for seed in range(3):
        keras.utils.set_random_seed(seed)
        model = _build(policy, nested=bool(seed % 2))
        copy = _rebuild(model).copy
        x = _inputs(64, seed)
        want, got = np.asarray(copy(x), "float64"), np.asarray(model(x), "float64")
        error = np.abs(got - want).max() / np.abs(want).max()
        worst = max(worst, error / mp.compute_tolerance(model))
    assert worst <= 0.5, worst


@pytest.mark.parametrize("policy", POLICIES)
def test_to_saved_model_exports_the_float32_copy(policy, tmp_path):
    model = _build(policy)
    before, policies = _weights(model), _policies(model)
    result = to_saved_model(model, tmp_path / "sm", verify_inputs=_inputs())

    assert result.rebuilt_from == policy
    assert [(f.batchnorm, f.into) for f in result.fold_report.folded] == [
        ("bn", "conv")
    ]
    # Folded in float32: the fold's self-check holds its float32 contract
    # (folding the half-precision model itself rounds the folded kernel to
    # float16, about 1.2e-3).
    assert result.fold_report.check_error < 1e-5
    assert result.verification.tolerance == 1e-4
    original = result.original_verification
    assert original.tolerance == pytest.approx(1e-4 + mp.compute_tolerance(model))
    # The artifact computes in float32: it sits much closer to the float32
    # copy than to the half-precision original.
    assert result.verification.max_rel_error < original.max_rel_error
    assert _policies(model) == policies
    for a, b in zip(_weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize(
    "policy", ["mixed_float16", pytest.param("mixed_bfloat16", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("quantize", [None, "float16", "dynamic", "int8"])
def test_to_tflite_every_mode(policy, quantize, tmp_path):
    # Seeded: with whatever weights the tests before it leave, this random
    # untrained net's int8 rms error ranged 0.02-0.15 over seeds 0-7 (the
    # full-integer file's too), across the 0.1 limit.
    keras.utils.set_random_seed(3)
    model = _build(policy)
    before = _weights(model)
    x = _inputs(32)
    result = to_tflite(
        model,
        tmp_path / "m.tflite",
        quantize=quantize,
        representative_data=x,
        verify_inputs=x,
    )
    assert result.rebuilt_from == policy
    assert result.fold_report.folded
    assert result.original_verification.tolerance == pytest.approx(
        result.verification.tolerance + mp.compute_tolerance(model)
    )
    assert result.original_verification.criterion == result.verification.criterion
    for a, b in zip(_weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_nested_model_with_a_float32_pinned_layer(tmp_path):
    model = _build("mixed_float16", nested=True)
    result = to_tflite(model, tmp_path / "m.tflite", verify_inputs=_inputs())
    assert result.rebuilt_from == "mixed_float16"
    assert model.get_layer("inner").get_layer("inner_dense").compute_dtype == "float16"
    assert model.get_layer("inner").get_layer("inner_ln").compute_dtype == "float32"


def test_export_dtype_float16_saved_model_computes_in_float16(tmp_path):
    model = _build("mixed_bfloat16")
    result = to_saved_model(
        model, tmp_path / "sm", verify_inputs=_inputs(), export_dtype="float16"
    )
    assert result.rebuilt_from == "mixed_bfloat16"
    ops = result.verification.ops
    assert "Cast" in ops  # the mixed_float16 graph casts between dtypes
    # Against the original bfloat16 model: within both compute tolerances.
    # It computes in float16: further from the float32 model than float32
    # rounding (1e-6) would put it.
    float32_copy = _rebuild(model).copy
    x = _inputs()
    import tensorflow as tf

    loaded = tf.saved_model.load(result.path).signatures["serving_default"]
    got = loaded(image=tf.constant(x))["logits"].numpy()
    want = np.asarray(float32_copy(x))
    error = np.abs(got - want).max() / np.abs(want).max()
    assert 1e-5 < error < mp.compute_tolerance(model)


def test_export_dtype_float16_tflite_stores_float16_weights(tmp_path):
    model = _build("mixed_float16")
    result = to_tflite(
        model, tmp_path / "m.tflite", verify_inputs=_inputs(), export_dtype="float16"
    )
    assert result.quantize == "float16"
    assert result.rebuilt_from == "mixed_float16"
    # float16 weights, dequantized to the float32 graph's kernels.
    assert result.verification.ops.get("DEQUANTIZE", 0) > 0
    plain = to_tflite(model, tmp_path / "p.tflite", verify_inputs=_inputs())
    assert plain.quantize is None
    assert "DEQUANTIZE" not in plain.verification.ops


def test_export_dtype_errors(tmp_path):
    model = _build("mixed_float16")
    x = _inputs()
    with pytest.raises(ValueError, match=r'export_dtype="float16" writes a TFLite'):
        to_tflite(
            model,
            tmp_path / "m.tflite",
            quantize="int8",
            representative_data=x,
            export_dtype="float16",
        )
    with pytest.raises(ValueError, match=r"export_dtype should be one of"):
        to_saved_model(model, tmp_path / "sm", export_dtype="float64")
    assert not os.path.exists(tmp_path / "m.tflite")


class _NeedsScale(keras.layers.Layer):
    """A layer whose config does not rebuild it (`scale` is missing)."""

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):
        return x * self.scale


def test_rebuild_failure_names_the_half_layers(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    x = keras.Input((4,))
    y = keras.layers.Dense(4, name="d")(x)
    model = keras.Model(x, _NeedsScale(2.0, name="scaled")(y))
    keras.config.set_dtype_policy("float32")
    with pytest.raises(
        ExportConversionError, match=r"layer\(s\) 'd', 'scaled' under 'mixed_float16'"
    ):
        to_tflite(model, tmp_path / "m.tflite")
    assert not os.path.exists(tmp_path / "m.tflite")


def test_refusal_names_the_half_precision_layers():
    """The converter-error message, if a half-precision graph ever reaches
    it, names the float16 layers and not the float32 output layer."""
    model = _build("mixed_float16")
    err = explain(model, 1, RuntimeError("TF Select ops: Conv2D, MatMul."))
    text = str(err)
    assert "'conv', 'bn', 'relu', 'gn', 'pool', 'dense', 'ln'" in text
    assert "'logits'" not in text
    assert "float16" in text and "export_dtype='float32'" in text


def test_quantize_aware_takes_a_mixed_model():
    pytest.importorskip("tensorflow_model_optimization")
    from kerasnorm.export import quantize_aware

    model = _build("mixed_float16")
    before = _weights(model)
    qat = quantize_aware(model, verify_inputs=_inputs())
    names = {w.name for w in qat.weights}
    assert any("quantize" in n or "min" in n for n in names)
    assert all(w.dtype == "float32" for w in qat.weights if "kernel" in w.name)
    for a, b in zip(_weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_cli_exports_a_keras_file_saved_under_mixed_precision(tmp_path, capsys):
    model = _build("mixed_float16")
    path = str(tmp_path / "net.keras")
    keras.config.set_dtype_policy("mixed_float16")
    model.save(path)
    keras.config.set_dtype_policy("float32")
    calibration = str(tmp_path / "x.npy")
    np.save(calibration, _inputs(32))
    out = str(tmp_path / "out")
    argv = ["export", path, "--out", out, "--calibration", calibration]
    code = main([*argv, "--saved-model", "--quantize", "int8"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert text.count("computes under 'mixed_float16'") == 2, text
    assert "against the mixed_float16 model" in text
    assert os.path.isfile(os.path.join(out, "net.int8.tflite"))
    assert os.path.isdir(os.path.join(out, "net", "1"))
    assert keras.config.dtype_policy().name == "float32"


def test_streaming_export_of_a_mixed_lstm(tmp_path):
    import kerasnorm

    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((5, 3)),
            kerasnorm.LayerNormLSTM(4, return_sequences=True, name="lstm"),
            keras.layers.Dense(2, name="out", dtype="float32"),
        ]
    )
    keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(0).standard_normal((4, 5, 3)).astype("float32")
    result = to_tflite(model, tmp_path / "s.tflite", verify_inputs=x, streaming=True)
    assert result.rebuilt_from == "mixed_float16"
    assert model.get_layer("lstm").compute_dtype == "float16"


def test_cli_export_dtype_float16_writes_float16_weights(tmp_path, capsys):
    from kerasnorm.export import litert

    model = _build("mixed_float16")
    path = str(tmp_path / "net.keras")
    model.save(path)
    out = str(tmp_path / "out")
    code = main(["export", path, "--out", out, "--tflite", "--export-dtype", "float16"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "computes under 'mixed_float16'" in text
    with open(os.path.join(out, "net.tflite"), "rb") as f:
        ops = litert.op_counts(f.read())
    assert ops.get("DEQUANTIZE", 0) > 0  # float16 weights
