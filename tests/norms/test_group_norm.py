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
            ({"groups": 2}, (2, 4, 4, 8)),
            ({"groups": 3, "axis": 1, "center": False}, (2, 6, 3, 4)),
            ({"groups": 4, "scale": False}, (3, 5, 8)),
        ]
    ),
)
def test_layer_test_helper(kwargs, shape, checks, tmp_path):
    run_layer_test(kerasnorm.GroupNorm, kwargs, shape, tmp_path, checks=checks)


@pytest.mark.parametrize(
    "shape, groups, axis",
    [
        ((3, 8), 4, -1),
        ((2, 5, 6), 3, -1),
        ((2, 4, 5, 8), 2, -1),
        ((2, 8, 4, 5), 4, 1),
        ((2, 3, 6, 5), 2, 2),
        ((2, 3, 3, 2, 4), 2, -1),
    ],
)
def test_matches_numpy_reference(shape, groups, axis):
    x = random_inputs(shape, offset=2.0, scale=3.0)
    layer = kerasnorm.GroupNorm(
        groups=groups,
        axis=axis,
        gamma_initializer="random_normal",
        beta_initializer="random_normal",
    )
    y = np.asarray(layer(x))
    expected = reference.group_norm(
        x, groups, axis, 1e-5, layer.gamma.numpy(), layer.beta.numpy()
    )
    np.testing.assert_allclose(y, expected, atol=2e-5)


def test_dynamic_spatial_dimensions():
    model = keras.Sequential([keras.Input((None, None, 6)), kerasnorm.GroupNorm(3)])
    for shape in ((2, 3, 4, 6), (1, 5, 2, 6)):
        x = random_inputs(shape)
        expected = reference.group_norm(x, 3, -1, 1e-5)
        np.testing.assert_allclose(np.asarray(model(x)), expected, atol=2e-5)


@pytest.mark.tf_only
def test_run_time_batch_leaves_no_shape_arithmetic_in_the_graph():
    """Traced with an undefined batch (a dynamic-batch export), the grouped
    view and the reshape back take -1 for the batch: the graph computes no
    shape (a `.tflite` file would run `SHAPE`/`STRIDED_SLICE`/`PACK` outside
    XNNPACK), and the values are the reference's at two batch sizes."""
    import tensorflow as tf

    layer = kerasnorm.GroupNorm(
        4, gamma_initializer="random_normal", beta_initializer="random_normal"
    )
    layer.build((None, 3, 5, 8))
    fn = tf.function(layer).get_concrete_function(tf.TensorSpec((None, 3, 5, 8)))
    reshapes = [op for op in fn.graph.get_operations() if op.type == "Reshape"]
    # The input's and the output's reshape (the parameters' too): each
    # target a constant, none computed from the input's run-time shape.
    assert len(reshapes) >= 2
    for op in reshapes:
        assert op.inputs[1].op.type == "Const", (op.name, op.inputs[1].op.type)
    for batch in (1, 3):
        x = random_inputs((batch, 3, 5, 8))
        expected = reference.group_norm(
            x, 4, -1, 1e-5, layer.gamma.numpy(), layer.beta.numpy()
        )
        np.testing.assert_allclose(fn(tf.constant(x)).numpy(), expected, atol=2e-5)


def test_mask_excludes_padded_steps():
    x = random_inputs((2, 5, 4))
    lengths = [5, 3]
    padded = x.copy()
    padded[1, 3:] = 100.0
    mask = np.arange(5)[None, :] < np.array(lengths)[:, None]
    layer = kerasnorm.GroupNorm(groups=2)
    y = np.asarray(layer(padded, mask=mask))
    for n, length in enumerate(lengths):
        expected = reference.group_norm(x[n : n + 1, :length], 2, -1, 1e-5)
        np.testing.assert_allclose(y[n : n + 1, :length], expected, atol=2e-5)


def test_masking_layer_propagates():
    inputs = keras.Input((None, 4))
    masked = keras.layers.Masking(mask_value=0.0)(inputs)
    normed = kerasnorm.GroupNorm(groups=2)(masked)
    model = keras.Model(inputs, normed)
    x = random_inputs((1, 3, 4))
    padded = np.concatenate([x, np.zeros((1, 2, 4), "float32")], axis=1)
    np.testing.assert_allclose(
        np.asarray(model(padded))[:, :3], np.asarray(model(x)), atol=1e-5
    )


def test_gradients_match_keras_group_normalization():
    assert_same_gradients(
        kerasnorm.GroupNorm(groups=4, epsilon=1e-3),
        keras.layers.GroupNormalization(groups=4, epsilon=1e-3),
        random_inputs((2, 3, 3, 8), seed=2),
        [("gamma", "gamma"), ("beta", "beta")],
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"groups": 0}, r"argument `groups` must be a positive integer.*groups=0"),
        ({"groups": -2}, r"Received: groups=-2"),
        ({"groups": 2.0}, r"Received: groups=2\.0"),
        ({"groups": True}, r"Received: groups=True"),
        ({"axis": [1, 2]}, r"`axis` must be an int. Received: axis=\[1, 2\]"),
        ({"epsilon": -1.0}, r"Received: epsilon=-1\.0"),
        ({"axis": 0}, r"cannot be the batch axis 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.GroupNorm(**kwargs)


@pytest.mark.parametrize(
    "kwargs, shape, match",
    [
        ({"groups": 3}, (None, 4, 8), r"`groups` must divide.*8 channels.*groups=3"),
        (
            {"groups": 16},
            (None, 4, 8),
            r"groups \(16\) cannot be more than the number "
            r"of channels \(8\)",
        ),
        ({"groups": 2, "axis": 3}, (None, 4, 8), r"axis 3 is out of bounds"),
        ({"groups": 2, "axis": -3}, (None, 4, 8), r"cannot be the batch axis"),
        ({"groups": 2}, (None, 4, None), r"axis 2 of the input.*must be defined"),
        ({"groups": 1}, (8,), r"rank >= 2"),
    ],
)
def test_bad_shapes(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.GroupNorm(**kwargs).build(shape)


@pytest.mark.parametrize("axis", [-1, 1])
def test_groups_minus_one_is_one_group_per_channel(axis):
    """`groups=-1` (Keras' GroupNormalization sentinel): InstanceNorm, the
    same as `groups=C`; the config keeps -1, so the layer adapts to the
    channels of whatever input it is built for."""
    x = random_inputs((2, 6, 5, 4) if axis == -1 else (2, 4, 6, 5), seed=9)
    per_channel = kerasnorm.GroupNorm(groups=-1, axis=axis, epsilon=1e-3)
    y = np.asarray(per_channel(x))
    np.testing.assert_allclose(y, reference.group_norm(x, 4, axis, 1e-3), atol=2e-5)
    np.testing.assert_allclose(
        y, np.asarray(kerasnorm.InstanceNorm(axis=axis, epsilon=1e-3)(x)), atol=1e-5
    )
    assert per_channel.get_config()["groups"] == -1
    restored = kerasnorm.GroupNorm.from_config(per_channel.get_config())
    wider = random_inputs((2, 6, 5, 8) if axis == -1 else (2, 8, 6, 5), seed=10)
    np.testing.assert_allclose(
        np.asarray(restored(wider)),
        reference.group_norm(wider, 8, axis, 1e-3),
        atol=2e-5,
    )
