import keras
import numpy as np
import pytest

import kerasnorm
from tests import reference
from tests.helpers import assert_same_gradients
from tests.helpers import random_inputs
from tests.helpers import run_layer_test


@pytest.mark.parametrize(
    "kwargs, shape",
    [
        ({}, (4, 6)),
        ({"axis": [1, 2], "center": False}, (3, 5, 4)),
        ({"axis": 1, "scale": False, "epsilon": 1e-3}, (2, 6, 3)),
    ],
)
def test_layer_test_helper(kwargs, shape, tmp_path):
    run_layer_test(kerasnorm.LayerNorm, kwargs, shape, tmp_path)


@pytest.mark.parametrize(
    "shape, axis",
    [
        ((5, 7), -1),
        ((3, 4, 6), -1),
        ((3, 4, 6), [1, 2]),
        ((2, 3, 4, 5), [1, 3]),
        ((4, 6, 3), 1),
    ],
)
def test_matches_numpy_reference(shape, axis):
    x = random_inputs(shape, offset=3.0, scale=2.0)
    layer = kerasnorm.LayerNorm(
        axis=axis, gamma_initializer="random_normal", beta_initializer="random_normal"
    )
    y = np.asarray(layer(x))
    axes = [axis] if isinstance(axis, int) else axis
    expected = reference.layer_norm(
        x, axes, 1e-5, layer.gamma.numpy(), layer.beta.numpy()
    )
    np.testing.assert_allclose(y, expected, atol=2e-5)


def test_large_mean_is_accurate():
    """|mean| = 1e4, std 1: the two-pass variance keeps the float32 result
    within 1e-2 of a float64 reference (one-pass E[x^2]-E[x]^2 does not)."""
    x = random_inputs((8, 256), seed=3) + 1e4
    y = np.asarray(kerasnorm.LayerNorm()(x))
    np.testing.assert_allclose(y, reference.layer_norm(x, [-1], 1e-5), atol=1e-2)


def test_gradients_match_keras_layer_normalization():
    assert_same_gradients(
        kerasnorm.LayerNorm(axis=[1, 2], epsilon=1e-3),
        keras.layers.LayerNormalization(axis=[1, 2], epsilon=1e-3),
        random_inputs((4, 3, 16), seed=2),
        [("gamma", "gamma"), ("beta", "beta")],
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 0.0}, r"epsilon.*Received: epsilon=0\.0"),
        ({"epsilon": -1e-5}, r"Received: epsilon=-1e-05"),
        ({"epsilon": "small"}, r"Received: epsilon='small'"),
        ({"axis": 1.5}, r"axis.*Received: axis=1\.5"),
        ({"axis": []}, r"Received: axis=\[\]"),
        ({"axis": [1, "2"]}, r"Received: axis=\[1, '2'\]"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.LayerNorm(**kwargs)


@pytest.mark.parametrize(
    "axis, shape, match",
    [
        (3, (None, 4, 5), r"axis 3 is out of range.*rank 3"),
        ([1, -2], (None, 4, 5), r"Duplicate axes.*Received: axis=\[1, -2\]"),
        (1, (None, None, 5), r"must be defined"),
    ],
)
def test_bad_shapes(axis, shape, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.LayerNorm(axis=axis).build(shape)
