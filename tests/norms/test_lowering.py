"""The norms' float32 `.tflite` graph (`kerasnorm/_core/lowering.py`): inside
`float32_tflite()` the layers compute the same function, against the numpy
references, for every layout it lowers and every one it leaves alone."""

import itertools

import numpy as np
import pytest

import kerasnorm
from kerasnorm._core import lowering
from tests.support import reference
from tests.support.helpers import random_inputs

AFFINE = list(itertools.product([True, False], repeat=2))  # (center, scale)


def _random_affine(layer):
    rng = np.random.default_rng(7)
    for weight in layer.weights:
        weight.assign(rng.normal(1.0, 0.5, weight.shape).astype("float32"))


def _params(layer):
    gamma = None if layer.gamma is None else np.asarray(layer.gamma)
    beta = None if layer.beta is None else np.asarray(layer.beta)
    return gamma, beta


def _lowered(layer, x, **kwargs):
    with lowering.float32_tflite():
        return np.asarray(layer(x, **kwargs))


@pytest.mark.parametrize("center, scale", AFFINE)
@pytest.mark.parametrize("groups", [1, 2, 8, -1])
@pytest.mark.parametrize("shape", [(2, 5, 8), (2, 4, 3, 8), (2, 3, 2, 2, 8)])
def test_group_norm_in_channel_space_is_group_norm(shape, groups, center, scale):
    # Offset far from zero: the statistics are of the centred values.
    x = random_inputs(shape, offset=50.0, scale=3.0)
    layer = kerasnorm.GroupNorm(groups, center=center, scale=scale)
    layer.build(shape)
    _random_affine(layer)
    want = reference.group_norm(
        x, 8 if groups == -1 else groups, -1, 1e-5, *_params(layer)
    )
    np.testing.assert_allclose(_lowered(layer, x), want, atol=5e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(layer(x)), want, atol=5e-5, rtol=0)


@pytest.mark.parametrize("center, scale", AFFINE)
@pytest.mark.parametrize(
    "cls, kwargs, ref",
    [
        (kerasnorm.LayerNorm, {}, reference.layer_norm),
        (
            kerasnorm.RMSNorm,
            {},
            lambda x, axes, eps, g, b: reference.rms_norm(x, axes, eps, 1.0, g, b),
        ),
        (
            kerasnorm.RMSNorm,
            {"partial": 0.5},
            lambda x, axes, eps, g, b: reference.rms_norm(x, axes, eps, 0.5, g, b),
        ),
    ],
)
def test_the_gain_as_a_depthwise_convolution_is_the_gain(
    cls, kwargs, ref, center, scale
):
    shape = (2, 3, 4, 8)
    x = random_inputs(shape, offset=2.0, scale=3.0)
    layer = cls(center=center, scale=scale, **kwargs)
    layer.build(shape)
    _random_affine(layer)
    want = ref(x, (-1,), layer.epsilon, *_params(layer))
    np.testing.assert_allclose(_lowered(layer, x), want, atol=5e-5, rtol=0)


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: kerasnorm.GroupNorm(2, axis=1), (2, 4, 3, 3)),  # channels first
        (lambda: kerasnorm.GroupNorm(2), (3, 4)),  # no spatial axis
        (lambda: kerasnorm.LayerNorm(axis=(1, 2, 3)), (2, 3, 4, 5)),
        (lambda: kerasnorm.LayerNorm(), (2, 5, 8)),  # rank 3: no depthwise op
        (lambda: kerasnorm.InstanceNorm(), (2, 4, 4, 6)),
    ],
)
def test_the_layouts_it_leaves_alone_compute_as_before(build, shape):
    x = random_inputs(shape, offset=1.0, scale=2.0)
    layer = build()
    layer.build(shape)
    _random_affine(layer)
    np.testing.assert_allclose(_lowered(layer, x), np.asarray(layer(x)), atol=1e-6)


def test_a_masked_group_norm_keeps_its_masked_statistics():
    x = random_inputs((2, 6, 8), scale=2.0)
    x[0, 4:] = np.nan  # padding: must not reach the statistics
    mask = np.ones((2, 6), bool)
    mask[0, 4:] = False
    layer = kerasnorm.GroupNorm(2)
    got = _lowered(layer, x, mask=mask)
    want = reference.group_norm(x[:1, :4], 2, -1, 1e-5)
    np.testing.assert_allclose(got[0, :4], want[0], atol=5e-5)
    np.testing.assert_allclose(
        got[1:], reference.group_norm(x[1:], 2, -1, 1e-5), atol=5e-5
    )


@pytest.mark.parametrize("cls", [kerasnorm.GroupNorm, kerasnorm.LayerNorm])
def test_under_mixed_precision_it_returns_the_compute_dtype(cls):
    x = random_inputs((2, 4, 4, 8), offset=3.0)
    layer = (
        cls(groups=4, dtype="mixed_float16")
        if cls is kerasnorm.GroupNorm
        else cls(dtype="mixed_float16")
    )
    layer.build(x.shape)
    y = _lowered(layer, x)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, np.asarray(layer(x)), atol=1e-2)


def test_the_context_is_off_outside_and_after_an_error():
    assert not lowering.active()
    with pytest.raises(RuntimeError):
        with lowering.float32_tflite():
            assert lowering.active()
            raise RuntimeError("inside")
    assert not lowering.active()
