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
            ({}, (2, 4, 4, 3)),
            ({"axis": 1, "center": False}, (2, 3, 5, 4)),
            ({"scale": False}, (3, 6, 4)),
        ]
    ),
)
def test_layer_test_helper(kwargs, shape, checks, tmp_path):
    run_layer_test(kerasnorm.InstanceNorm, kwargs, shape, tmp_path, checks=checks)


@pytest.mark.parametrize(
    "shape, axis",
    [((2, 5, 3), -1), ((2, 4, 5, 3), -1), ((2, 3, 4, 5), 1), ((2, 3, 2, 4, 3), -1)],
)
def test_matches_numpy_reference(shape, axis):
    x = random_inputs(shape, offset=-4.0, scale=2.0)
    layer = kerasnorm.InstanceNorm(
        axis=axis, gamma_initializer="random_normal", beta_initializer="random_normal"
    )
    y = np.asarray(layer(x))
    expected = reference.instance_norm(
        x, axis, 1e-5, layer.gamma.numpy(), layer.beta.numpy()
    )
    np.testing.assert_allclose(y, expected, atol=2e-5)


def test_mask_excludes_padded_steps():
    x = random_inputs((2, 6, 3))
    padded = x.copy()
    padded[0, 4:] = -50.0
    mask = np.array([[1, 1, 1, 1, 0, 0], [1] * 6], dtype=bool)
    y = np.asarray(kerasnorm.InstanceNorm()(padded, mask=mask))
    np.testing.assert_allclose(
        y[0, :4], reference.instance_norm(x[:1, :4], -1, 1e-5)[0], atol=2e-5
    )
    np.testing.assert_allclose(
        y[1], reference.instance_norm(x[1:], -1, 1e-5)[0], atol=2e-5
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"axis": [1]}, r"`axis` must be an int. Received: axis=\[1\]"),
        ({"epsilon": 0.0}, r"Received: epsilon=0\.0"),
        ({"axis": 0}, r"cannot be the batch axis 0\. Received: axis=0$"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.InstanceNorm(**kwargs)


@pytest.mark.parametrize(
    "kwargs, shape, match",
    [
        ({}, (None, 8), r"at least one spatial axis.*\(None, 8\)"),
        ({"axis": 5}, (None, 4, 8), r"axis 5 is out of bounds"),
        ({"axis": -3}, (None, 4, 8), r"cannot be the batch axis.*axis=-3"),
        ({}, (None, 4, None), r"must be defined"),
    ],
)
def test_bad_shapes(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.InstanceNorm(**kwargs).build(shape)


def test_variable_length_sequences():
    model = keras.Sequential([keras.Input((None, 3)), kerasnorm.InstanceNorm()])
    for length in (2, 7):
        x = random_inputs((2, length, 3), seed=length)
        np.testing.assert_allclose(
            np.asarray(model(x)), reference.instance_norm(x, -1, 1e-5), atol=2e-5
        )


def test_gradients_match_keras_group_normalization_with_one_channel_per_group():
    assert_same_gradients(
        kerasnorm.InstanceNorm(epsilon=1e-3),
        keras.layers.GroupNormalization(groups=6, epsilon=1e-3),
        random_inputs((2, 4, 3, 6), seed=2),
        [("gamma", "gamma"), ("beta", "beta")],
    )
