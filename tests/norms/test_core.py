"""The shared math core: accuracy, dtypes, masks."""

import numpy as np
import pytest
from keras import backend
from keras import ops

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm._core import reshape_target
from tests.support.backend import value_and_gradients
from tests.support.helpers import random_inputs


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


# Central differences need a float64 forward pass. Keras' `ops.mean` on JAX
# accumulates float64 inputs in float32 (off by ~5e-9), which central
# differences turn into ~1e-3 noise; on JAX the gradients are checked
# against autodiff of the formula instead.
_FLOAT64_MEAN = pytest.mark.skipif(
    backend.backend() == "jax",
    reason="Keras' ops.mean on JAX sums float64 in float32",
)


# (input shape, reduced axes, gain/bias shape or None, whether the mean is
# subtracted): the layouts `normalize` writes its own gradient for (the
# statistics over the last axes, the parameters over the same axes).
_TRAILING_CASES = [
    ((3, 5), (1,), (5,), True),
    ((2, 3, 4), (1, 2), (3, 4), True),
    ((2, 3, 4), (2,), (1, 1, 4), True),
    ((3, 5), (1,), (5,), False),
    ((2, 3, 4), (2,), None, True),
]


def _normalize_loss(shape, axes, param_shape, use_mean, weights):
    """sum(weights * normalize(x)) over freshly computed statistics, as a
    function of (x, gamma, beta) (gamma and beta left out when None)."""

    def loss(x, *params):
        mean, var = compute_stats(x, axes, use_mean=use_mean)
        scale, bias = params if params else (None, None)
        y = normalize(x, mean, var, epsilon=1e-3, scale=scale, bias=bias)
        return ops.sum(y * weights)

    return loss


@_FLOAT64_MEAN
@pytest.mark.parametrize("shape, axes, param_shape, use_mean", _TRAILING_CASES)
def test_normalize_gradients_match_finite_differences(
    shape, axes, param_shape, use_mean
):
    from kerasnorm._core import normalization

    x = random_inputs(shape, seed=1, offset=0.5).astype("float64")
    inputs = [x]
    if param_shape is not None:
        inputs += [random_inputs(param_shape, seed=s).astype("float64") for s in (2, 3)]
    weights = random_inputs(shape, seed=4).astype("float64")
    loss = _normalize_loss(shape, axes, param_shape, use_mean, weights)
    if backend.backend() in normalization._CUSTOM_GRADIENT_BACKENDS:
        var = np.ones(tuple(1 if a in axes else n for a, n in enumerate(shape)))
        params = [ops.convert_to_tensor(p) for p in inputs[1:]] or [None, None]
        assert normalization._trailing_axes(
            ops.convert_to_tensor(x), ops.convert_to_tensor(var), *params
        ) == len(axes)
    _, grads = value_and_gradients(loss, inputs)

    def value(arrays):
        return value_and_gradients(loss, arrays)[0]

    eps = 1e-6
    for i, array in enumerate(inputs):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            plus = [a.copy() for a in inputs]
            minus = [a.copy() for a in inputs]
            plus[i][index] += eps
            minus[i][index] -= eps
            numeric[index] = (value(plus) - value(minus)) / (2 * eps)
        np.testing.assert_allclose(grads[i], numeric, rtol=1e-6, atol=1e-7)


@_FLOAT64_MEAN
@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="second-order gradients through TensorFlow's custom gradient",
)
def test_normalize_second_order_gradients_match_finite_differences():
    """The written-out gradient is itself differentiable: the gradient of
    sum(v * dL/dx) matches central differences of dL/dx.

    RMS statistics: for a mean-centred variance `compute_stats` cuts the
    gradient through the mean, which is exact to first order only.
    """
    x = random_inputs((3, 6), seed=1, offset=0.5).astype("float64")
    gamma, beta = (random_inputs((6,), seed=s).astype("float64") for s in (2, 3))
    weights = random_inputs((3, 6), seed=4).astype("float64")
    v = random_inputs((3, 6), seed=5).astype("float64")
    loss = _normalize_loss((3, 6), (1,), (6,), False, weights)

    def first(x):
        return value_and_gradients(loss, [x, gamma, beta])[1][0]

    import tensorflow as tf

    xt = tf.constant(x)
    with tf.GradientTape() as outer:
        outer.watch(xt)
        with tf.GradientTape() as inner:
            inner.watch(xt)
            value = loss(xt, tf.constant(gamma), tf.constant(beta))
        directional = tf.reduce_sum(inner.gradient(value, xt) * v)
    second = outer.gradient(directional, xt).numpy()
    eps = 1e-6
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = ((first(plus) - first(minus)) * v).sum() / (2 * eps)
    np.testing.assert_allclose(second, numeric, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, axes, param_shape, use_mean", _TRAILING_CASES)
def test_normalize_gradients_match_autodiff_of_the_formula(
    shape, axes, param_shape, use_mean
):
    """The written-out gradient against autodiff of the same formula written
    with plain ops. They differ by rounding only: float64 rounding, or on
    JAX the float32 sums of Keras' `ops.mean` (see `_FLOAT64_MEAN`)."""
    x = random_inputs(shape, seed=1, offset=0.5).astype("float64")
    inputs = [x]
    if param_shape is not None:
        inputs += [random_inputs(param_shape, seed=s).astype("float64") for s in (2, 3)]
    weights = random_inputs(shape, seed=4).astype("float64")

    def formula(x, *params):
        mean = ops.mean(x, axis=axes, keepdims=True) if use_mean else 0.0
        var = ops.mean(ops.square(x - mean), axis=axes, keepdims=True)
        y = (x - mean) / ops.sqrt(var + 1e-3)
        if params:
            y = y * params[0] + params[1]
        return ops.sum(y * weights)

    loss = _normalize_loss(shape, axes, param_shape, use_mean, weights)
    _, grads = value_and_gradients(loss, inputs)
    _, expected = value_and_gradients(formula, inputs)
    rtol = 1e-5 if backend.backend() == "jax" else 1e-9
    for grad, reference in zip(grads, expected, strict=True):
        np.testing.assert_allclose(grad, reference, rtol=rtol, atol=rtol * 1e-3)


def test_reshape_target_writes_the_one_run_time_size_as_minus_one():
    run_time = ops.convert_to_tensor(2)
    assert reshape_target((run_time, 15, 4, 2)) == (-1, 15, 4, 2)
    assert reshape_target((6, run_time, 3)) == (6, -1, 3)
    assert reshape_target((2, 15, 4)) == (2, 15, 4)
    # Two run-time sizes cannot both be -1: the target is left as it is.
    both = reshape_target((run_time, run_time, 8))
    assert both[0] is run_time and both[1] is run_time and both[2] == 8
    x = np.arange(2 * 15 * 8, dtype="float32").reshape(2, 15, 8)
    y = ops.reshape(x, reshape_target((run_time, 15, 4, 2)))
    np.testing.assert_array_equal(np.asarray(y), x.reshape(2, 15, 4, 2))
