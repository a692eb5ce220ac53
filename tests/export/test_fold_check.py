"""The fold self-check tells float rounding from a wrong fold (float64 re-check)."""

import os

import keras
import numpy as np
import pytest

from kerasnorm.export import FoldVerificationError
from kerasnorm.export import fold_batchnorm
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify
from tests.support.helpers import random_inputs

# Exports (SavedModel, TFLite) trace TensorFlow.
pytestmark = pytest.mark.tf_only

L = keras.layers


def _randomize_bn(model, seed=0):
    """What export/models.py's `randomize_statistics` does to every
    BatchNormalization (the architectures benchmark's models)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            n = layer.moving_mean.shape
            layer.moving_mean.assign(rng.normal(0.0, 0.5, n))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n))
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n))
            if layer.center:
                layer.beta.assign(rng.normal(0.0, 0.3, n))
    return model


def _convnet(dtype=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            L.Conv2D(6, 3, use_bias=False, name="conv1", dtype=dtype),
            L.BatchNormalization(name="bn1", dtype=dtype),
            L.ReLU(dtype=dtype),
            L.Conv2D(6, 3, name="conv2", dtype=dtype),
            L.BatchNormalization(name="bn2", dtype=dtype),
            L.ReLU(dtype=dtype),
            L.GlobalAveragePooling2D(dtype=dtype),
            L.Dense(4, name="head", dtype=dtype),
        ],
        name="convnet",
    )
    return _randomize_bn(model)


def test_rounding_beyond_the_tolerance_is_not_a_wrong_fold():
    # A tolerance below float32 rounding stands in for a deep network whose
    # rounding exceeds 1e-5: the float32 comparison fails, the float64 one
    # (same weights, exact in principle) passes, and the report has both.
    model = _convnet()
    x = random_inputs((4, 8, 8, 3), scale=3.0)
    _, report = fold_batchnorm(
        model, return_report=True, verify_inputs=x, tolerance=1e-12
    )
    assert report.check_error > 1e-12, report  # float32 alone would refuse
    assert report.check_error < 1e-5, report
    assert report.check_error_float64 <= 1e-12, report
    assert report.check_shapes == [(4, 8, 8, 3)]
    assert "in float64" in str(report), report
    # Within float32's tolerance nothing is re-checked.
    _, report = fold_batchnorm(model, return_report=True, verify_inputs=x)
    assert report.check_error <= 1e-5 and report.check_error_float64 is None


def _perturb_one_kernel(monkeypatch, name, relative=1e-3):
    """Plant a wrong fold: `name`'s folded kernel off by `relative`."""
    from kerasnorm.export.fold import rewrite as _fold_rewrite

    write = _fold_rewrite._write_folded_weights

    def wrong(layer, copy, steps):
        write(layer, copy, steps)
        if layer.name == name:
            kernel = copy.kernel
            value = np.asarray(kernel.numpy(), "float64")
            kernel.assign((value * (1 + relative)).astype(kernel.dtype))

    monkeypatch.setattr(_fold_rewrite, "_write_folded_weights", wrong)


@pytest.mark.parametrize("dtype", [None, "mixed_float16", "float16"])
def test_a_planted_wrong_fold_is_caught(monkeypatch, dtype):
    # float16 rounding is 1e-3 of a value: its own 1e-2 tolerance cannot see
    # a kernel off by 1e-3, the float64 re-check (run for every half
    # precision model) does.
    model = _convnet(dtype)
    x = random_inputs((4, 8, 8, 3), scale=3.0)
    _, report = fold_batchnorm(model, return_report=True, verify_inputs=x)
    if dtype is not None:
        assert report.check_error_float64 < 1e-9, report
    _perturb_one_kernel(monkeypatch, "conv2")
    with pytest.raises(
        FoldVerificationError,
        match=r"Outputs first diverge at layer\(s\) 'conv2' \(.*In float64 it "
        r"differs by .* a wrong fold, not float rounding",
    ):
        fold_batchnorm(model, verify_inputs=x)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, export",
    [
        pytest.param("EfficientNetV2B2", to_saved_model, marks=pytest.mark.exhaustive),
        ("EfficientNetV2B3", to_tflite),
    ],
)
def test_efficientnet_v2_folds_and_exports(tmp_path, name, export):
    # A real architecture where float32 rounding alone differs by more
    # than 1e-5 (fold) and 1e-4 (parity) of the output scale; both in
    # float64 are exact to ~1e-13.
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(
        weights=None, input_shape=(64, 64, 3), classifier_activation=None
    )
    _randomize_bn(model)
    x = np.random.default_rng(1).uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    path = tmp_path / ("m" if export is to_saved_model else "m.tflite")
    result = export(model, path, verify_inputs=x)
    report = result.fold_report
    assert report.check_error > 1e-5, report
    assert report.check_error_float64 < 1e-9, report
    assert not report.kept or all("activation" in k.reason for k in report.kept)
    check = result.verification
    assert check.passed and check.samples == 4, check
    if check.max_rel_error > 1e-4:
        assert check.float64_error <= 1e-4 + 4 * check.float32_rounding, check
    assert os.path.exists(result.path)


def test_parity_recheck_in_float64(tmp_path):
    # The same split for the artifact: a tolerance below float32 rounding
    # passes when the artifact is as close to the float64 model as Keras'
    # own float32 run is, and a wrong artifact still fails.
    model = _convnet()
    x = random_inputs((4, 8, 8, 3), scale=3.0)
    # LiteRT's kernels round differently from TensorFlow's (a SavedModel of
    # this small model runs the same kernels and matches exactly).
    result = to_tflite(model, tmp_path / "m.tflite", fold=False, verify_inputs=x)
    tight = verify(model, result.path, x, tolerance=1e-12)
    assert tight.max_rel_error > 1e-12 and tight.passed, tight
    assert tight.float64_error is not None and tight.float32_rounding > 0, tight
    assert "against float64 Keras" in str(tight)
    other = _convnet()
    other.get_layer("conv2").kernel.assign(
        np.asarray(other.get_layer("conv2").kernel.numpy()) * 1.001
    )
    wrong = verify(other, result.path, x, tolerance=1e-12, raise_on_failure=False)
    assert not wrong.passed and wrong.float64_error > 1e-4, wrong
