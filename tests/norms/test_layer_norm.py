import warnings

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support import reference
from tests.support.helpers import assert_same_gradients
from tests.support.helpers import random_inputs
from tests.support.helpers import run_layer_test
from tests.support.helpers import tiered


@pytest.mark.parametrize(
    "kwargs, shape, checks",
    tiered(
        [
            ({}, (4, 6)),
            ({"axis": [1, 2], "center": False}, (3, 5, 4)),
            ({"axis": 1, "scale": False, "epsilon": 1e-3}, (2, 6, 3)),
        ]
    ),
)
def test_layer_test_helper(kwargs, shape, checks, tmp_path):
    run_layer_test(kerasnorm.LayerNorm, kwargs, shape, tmp_path, checks=checks)


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
        (3, (None, 4, 5), r"axis 3 is out of bounds.*rank 3"),
        ([1, -2], (None, 4, 5), r"Duplicate axes.*Received: axis=\[1, -2\]"),
        (1, (None, None, 5), r"must be defined"),
    ],
)
def test_bad_shapes(axis, shape, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.LayerNorm(axis=axis).build(shape)


@pytest.mark.parametrize("axis", [1.5, "1", None, {"axis": -1}])
def test_axis_of_another_type_is_a_type_error_worded_as_keras(axis):
    """A TypeError with Keras' wording (as its LayerNormalization raises),
    which is also a ValueError (as every other bad argument here)."""
    with pytest.raises(
        TypeError,
        match=r"Expected an int or a list/tuple of ints "
        r"for the argument 'axis'.*Received: axis=",
    ):
        kerasnorm.LayerNorm(axis=axis)
    with pytest.raises(ValueError):
        kerasnorm.LayerNorm(axis=axis)


def test_rms_scaling_is_keras_option():
    """Keras' deprecated `rms_scaling=True`: x / sqrt(var + eps) * gamma, the
    variance around the mean but the mean kept, gamma only, a warning; the
    same output and gradients as Keras' LayerNormalization with it."""
    x = random_inputs((4, 3, 8), offset=2.0, seed=7)
    with pytest.warns(UserWarning, match="rms_scaling"):
        layer = kerasnorm.LayerNorm(
            axis=[1, 2],
            epsilon=1e-3,
            rms_scaling=True,
            center=True,
            gamma_initializer="random_normal",
        )
    y = np.asarray(layer(x))
    assert [w.name for w in layer.trainable_weights] == ["gamma"]
    x64 = np.asarray(x, np.float64)
    var = x64.var(axis=(1, 2), keepdims=True)
    expected = x64 / np.sqrt(var + 1e-3) * layer.gamma.numpy()[None]
    np.testing.assert_allclose(y, expected, atol=2e-5)
    # Keras 3.15 warns that the option is deprecated, Keras 3.10 does not.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        keras_layer = keras.layers.LayerNormalization(
            axis=[1, 2], epsilon=1e-3, rms_scaling=True
        )
    with pytest.warns(UserWarning):
        fresh = kerasnorm.LayerNorm(axis=[1, 2], epsilon=1e-3, rms_scaling=True)
    assert_same_gradients(fresh, keras_layer, x, [("gamma", "gamma")])
    with pytest.warns(UserWarning):
        restored = kerasnorm.LayerNorm.from_config(layer.get_config())
    assert restored.rms_scaling and not restored.center
    assert layer.get_config()["rms_scaling"] is True
    assert kerasnorm.LayerNorm().get_config()["rms_scaling"] is False
