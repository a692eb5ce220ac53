"""The shared math core: accuracy, dtypes, masks."""

import numpy as np
import pytest
from keras import backend
from keras import ops

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
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
