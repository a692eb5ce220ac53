import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.norms.rms_norm import partial_units
from tests.support import reference
from tests.support.helpers import assert_same_gradients
from tests.support.helpers import random_inputs
from tests.support.helpers import run_layer_test
from tests.support.helpers import tiered


@pytest.mark.parametrize(
    "kwargs, shape, checks",
    tiered(
        [
            ({}, (4, 8)),
            ({"partial": 0.25, "center": True}, (3, 5, 8)),
            (
                {"axis": [1, 2], "partial": 0.5, "scale": False, "center": True},
                (2, 3, 6),
            ),
        ]
    ),
)
def test_layer_test_helper(kwargs, shape, checks, tmp_path):
    run_layer_test(kerasnorm.RMSNorm, kwargs, shape, tmp_path, checks=checks)


@pytest.mark.parametrize(
    "shape, axis, partial",
    [
        ((5, 16), -1, 1.0),
        ((3, 4, 16), -1, 0.0625),
        ((3, 4, 10), -1, 0.3),
        ((3, 4, 6), [1, 2], 0.5),
        ((2, 3, 4, 5), 1, 1.0),
    ],
)
def test_matches_numpy_reference(shape, axis, partial):
    x = random_inputs(shape, offset=0.5, scale=3.0)
    layer = kerasnorm.RMSNorm(
        axis=axis,
        partial=partial,
        center=True,
        gamma_initializer="random_normal",
        beta_initializer="random_normal",
    )
    y = np.asarray(layer(x))
    axes = [axis] if isinstance(axis, int) else axis
    expected = reference.rms_norm(
        x, axes, 1e-6, partial, layer.gamma.numpy(), layer.beta.numpy()
    )
    np.testing.assert_allclose(y, expected, atol=2e-5)


def test_partial_statistic_ignores_the_other_units():
    """With p=0.25 of 8 units only the first 2 set the RMS: changing the last
    6 inputs changes only those outputs, by exactly the same factor."""
    x = random_inputs((4, 8))
    x2 = x.copy()
    x2[:, 2:] *= 10.0
    layer = kerasnorm.RMSNorm(partial=0.25)
    y, y2 = np.asarray(layer(x)), np.asarray(layer(x2))
    np.testing.assert_allclose(y2[:, :2], y[:, :2], rtol=1e-6)
    np.testing.assert_allclose(y2[:, 2:], 10.0 * y[:, 2:], rtol=1e-5)


def test_partial_one_is_plain_rms_normalization():
    x = random_inputs((6, 12), seed=4)
    y = np.asarray(kerasnorm.RMSNorm(partial=1.0, epsilon=1e-6)(x))
    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, x / rms, atol=1e-6)


@pytest.mark.parametrize(
    "partial, n, k", [(1.0, 8, 8), (0.0625, 1024, 64), (0.1, 30, 3), (0.01, 8, 1)]
)
def test_partial_units(partial, n, k):
    assert partial_units(partial, n) == k


def test_gradients_match_keras_rms_normalization():
    assert_same_gradients(
        kerasnorm.RMSNorm(epsilon=1e-6),
        keras.layers.RMSNormalization(epsilon=1e-6),
        random_inputs((4, 3, 16), seed=2),
        [("gamma", "scale")],
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"partial": 0.0}, r"partial.*\(0, 1\]. Received: partial=0\.0"),
        ({"partial": 1.5}, r"Received: partial=1\.5"),
        ({"partial": True}, r"Received: partial=True"),
        ({"epsilon": 0}, r"Received: epsilon=0"),
        ({"axis": "last"}, r"Received: axis='last'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.RMSNorm(**kwargs)


@pytest.mark.parametrize(
    "kwargs, shape, match",
    [
        ({"axis": 1, "partial": 0.5}, (None, 4, 8), r"must include the last axis"),
        ({"axis": -4}, (None, 4, 8), r"axis -4 is out of bounds"),
        ({"axis": [2, 2]}, (None, 4, 8), r"Duplicate axes"),
        ({}, (None, 4, None), r"must be defined"),
    ],
)
def test_bad_shapes(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.RMSNorm(**kwargs).build(shape)
