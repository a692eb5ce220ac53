"""The shared math core: accuracy, dtypes, masks."""

import numpy as np
import pytest
from keras import backend
from keras import ops

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from tests.backend import value_and_gradients
from tests.helpers import random_inputs


def test_two_pass_variance_is_accurate_far_from_zero():
    x = random_inputs((4, 512), seed=1) + 1e4
    mean, var = compute_stats(x, (1,))
    y = np.asarray(normalize(x, mean, var, epsilon=1e-5))
    x64 = x.astype(np.float64)
    expected = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(
        x64.var(1, keepdims=True) + 1e-5
    )
    np.testing.assert_allclose(y, expected, atol=1e-2)
    np.testing.assert_allclose(np.asarray(var)[:, 0], x64.var(1), rtol=1e-3)


@pytest.mark.parametrize(
    "dtype, stats",
    [("float16", "float32"), ("bfloat16", "float32"), ("float64", "float64")],
)
def test_statistics_are_at_least_float32(dtype, stats):
    x = ops.cast(random_inputs((2, 8)) * 300.0, dtype)
    mean, var = compute_stats(x, (1,))
    assert backend.standardize_dtype(mean.dtype) == stats
    assert backend.standardize_dtype(var.dtype) == stats
    assert np.all(np.isfinite(np.asarray(var)))
    y = normalize(x, mean, var, epsilon=1e-5)
    assert backend.standardize_dtype(y.dtype) == dtype


def test_masked_statistics_use_only_valid_entries():
    x = random_inputs((2, 6, 3))
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=bool)
    mean, var = compute_stats(x, (1,), mask=mask[..., None])
    np.testing.assert_allclose(np.asarray(mean)[0, 0], x[0, :3].mean(0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(var)[0, 0], x[0, :3].var(0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(var)[1, 0], x[1].var(0), atol=1e-6)


def test_fully_masked_rows_give_zero_statistics():
    x = random_inputs((2, 4, 3))
    mask = np.zeros((2, 4, 1), dtype=bool)
    mean, var = compute_stats(x, (1,), mask=mask)
    assert np.all(np.asarray(mean) == 0) and np.all(np.asarray(var) == 0)


def test_rms_statistics_have_no_mean():
    x = random_inputs((3, 5)) + 2.0
    mean, var = compute_stats(x, (1,), use_mean=False)
    assert mean is None
    np.testing.assert_allclose(
        np.asarray(var)[:, 0], (x.astype(np.float64) ** 2).mean(1), rtol=1e-6
    )


@pytest.mark.parametrize("pad", [np.nan, np.inf])
@pytest.mark.parametrize("use_mean", [True, False])
def test_masked_entries_never_reach_statistics_or_gradients(pad, use_mean):
    x = random_inputs((2, 6, 3), offset=1.0)
    mask = np.ones((2, 6, 1), bool)
    mask[0, 4:] = False
    padded = np.where(mask, x, np.float32(pad))

    def total(inputs):
        mean, var = compute_stats(inputs, (1,), use_mean=use_mean, mask=mask)
        stats = [var] if mean is None else [var, mean]
        return ops.sum(var) + (0.0 if mean is None else ops.sum(mean)), stats

    _, stats, (grad,) = value_and_gradients(total, [padded], has_aux=True)
    var, mean = stats[0], stats[1] if use_mean else None
    valid = x[0, :4].astype(np.float64)
    expected_var = valid.var(0) if use_mean else (valid**2).mean(0)
    np.testing.assert_allclose(np.asarray(var)[0, 0], expected_var, rtol=1e-5)
    if use_mean:
        np.testing.assert_allclose(np.asarray(mean)[0, 0], valid.mean(0), rtol=1e-5)
    np.testing.assert_array_equal(grad[0, 4:], 0.0)
    # d var / d x_i = 2 (x_i - mean) / n (+ 1 / n from the mean) over 4 steps.
    centre = valid - valid.mean(0) if use_mean else valid
    np.testing.assert_allclose(
        grad[0, :4], 2 * centre / 4 + (0.25 if use_mean else 0.0), rtol=1e-4, atol=1e-6
    )


def test_mean_in_shift_is_the_same_normalization():
    x = random_inputs((3, 4, 8), offset=5.0, scale=2.0)
    mean, var = compute_stats(x, (1, 2))
    scale = random_inputs((1, 1, 8), seed=2)
    bias = random_inputs((1, 1, 8), seed=3)
    direct = normalize(x, mean, var, epsilon=1e-5, scale=scale, bias=bias)
    folded = normalize(
        x, mean, var, epsilon=1e-5, scale=scale, bias=bias, mean_in_shift=True
    )
    np.testing.assert_allclose(np.asarray(folded), np.asarray(direct), atol=1e-5)
