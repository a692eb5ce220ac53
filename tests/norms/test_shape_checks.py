"""Rank changes, `input_spec` and `compute_output_shape` of the four layers.

`axis` is resolved against each input's rank, as Keras' LayerNormalization
does; the weights' axes are pinned by the `input_spec` set in `build`.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support import reference
from tests.support.helpers import random_inputs


def _randomized(layer, shape):
    layer.build(shape)
    rng = np.random.default_rng(4)
    for w in layer.weights:
        w.assign(rng.standard_normal(w.shape).astype("float32"))
    return layer


def _reference(layer, x):
    gamma = None if layer.gamma is None else layer.gamma.numpy()
    beta = None if layer.beta is None else layer.beta.numpy()
    axes = [layer.axis] if isinstance(layer.axis, int) else layer.axis
    eps = layer.epsilon
    if isinstance(layer, kerasnorm.LayerNorm):
        return reference.layer_norm(x, axes, eps, gamma, beta)
    if isinstance(layer, kerasnorm.RMSNorm):
        return reference.rms_norm(x, axes, eps, layer.partial, gamma, beta)
    if isinstance(layer, kerasnorm.GroupNorm):
        return reference.group_norm(x, layer.groups, layer.axis, eps, gamma, beta)
    return reference.instance_norm(x, layer.axis, eps, gamma, beta)


@pytest.mark.parametrize(
    "cls, kwargs, built_for, called_on",
    [
        (kerasnorm.LayerNorm, {}, (2, 2, 2), (50, 2, 2, 2)),
        (kerasnorm.LayerNorm, {"axis": 1}, (None, 4, 3), (2, 4, 3, 5)),
        (kerasnorm.LayerNorm, {"axis": [1, -1]}, (None, 3, 4), (2, 3, 5, 4)),
        (kerasnorm.LayerNorm, {"axis": -2}, (None, 3, 4, 5), (2, 4, 5)),
        (kerasnorm.RMSNorm, {"center": True}, (2, 2, 2), (50, 2, 2, 2)),
        (kerasnorm.RMSNorm, {"partial": 0.5}, (None, 8), (2, 3, 8)),
        (kerasnorm.GroupNorm, {"groups": 2}, (None, 4, 4, 8), (2, 5, 8)),
        (kerasnorm.GroupNorm, {"groups": 2, "axis": 1}, (None, 8, 4, 4), (2, 8, 5)),
        (kerasnorm.InstanceNorm, {}, (None, 4, 4, 3), (2, 5, 3)),
    ],
)
def test_called_on_another_rank_normalizes_the_given_axes(
    cls, kwargs, built_for, called_on
):
    layer = _randomized(cls(**kwargs), built_for)
    x = random_inputs(called_on, offset=3.0, scale=2.0)
    np.testing.assert_allclose(np.asarray(layer(x)), _reference(layer, x), atol=2e-5)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (kerasnorm.LayerNorm(), keras.layers.LayerNormalization(epsilon=1e-5)),
        (kerasnorm.RMSNorm(), keras.layers.RMSNormalization(epsilon=1e-6)),
    ],
    ids=["LayerNorm", "RMSNorm"],
)
def test_keras_rms_normalization_test_case(ours, theirs):
    """Keras' rms_normalization_test: built for (2, 2, 2), called on
    (1000, 2, 2, 2); kerasnorm agrees with the Keras layer (within 1e-4: over
    two units whose variance is near 0, both differ from a float64 reference
    by up to 2e-4 in float32)."""
    ours.build((2, 2, 2))
    theirs.build((2, 2, 2))
    x = np.random.default_rng(0).normal(5.0, 10.0, (1000, 2, 2, 2)).astype("float32")
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(theirs(x)), atol=1e-4)


def test_axis_order_reversed_by_another_rank_is_refused():
    layer = kerasnorm.LayerNorm(axis=[2, -2])
    layer.build((None, 3, 4, 5, 6))  # axes 2 and 3
    with pytest.raises(
        ValueError,
        match=r"order \[2, -2\], which an input of rank 3 reverses\. "
        r"Received: axis=\[2, -2\], input_shape=\(2, 5, 4\)",
    ):
        layer(random_inputs((2, 5, 4)))  # axes 2 and 1


def test_partial_needs_the_last_axis_at_every_rank():
    layer = kerasnorm.RMSNorm(axis=1, partial=0.5)
    layer.build((None, 8))
    with pytest.raises(ValueError, match=r"must include the last axis.*\(2, 8, 3\)"):
        layer(random_inputs((2, 8, 3)))


@pytest.mark.parametrize(
    "cls, kwargs, built_for, called_on, axis, size",
    [
        (kerasnorm.LayerNorm, {}, (None, 4), (2, 5), -1, 4),
        (kerasnorm.LayerNorm, {"axis": [1, 2]}, (None, 3, 4), (2, 3, 5), 2, 4),
        (kerasnorm.RMSNorm, {}, (None, 3, 4), (2, 3, 6), -1, 4),
        (kerasnorm.GroupNorm, {"groups": 2}, (None, 3, 4), (2, 3, 6), -1, 4),
        (kerasnorm.GroupNorm, {"groups": 2, "axis": 1}, (None, 4, 3), (2, 6, 3), 1, 4),
        (kerasnorm.InstanceNorm, {}, (None, 3, 4), (2, 3, 5), -1, 4),
    ],
)
def test_another_size_on_a_parameter_axis_raises_value_error(
    cls, kwargs, built_for, called_on, axis, size
):
    layer = cls(name="the_norm", **kwargs)
    layer.build(built_for)
    shape = ", ".join(map(str, called_on))
    with pytest.raises(
        ValueError,
        # Keras 3.15 quotes the name 'the_norm', Keras 3.10 "the_norm".
        match=rf"layer ['\"]the_norm['\"] is incompatible.*expected axis {axis} "
        rf"of input shape to have value {size}, but received input with shape "
        rf"\({shape}\)",
    ):
        layer(random_inputs(called_on))


def test_instance_norm_built_for_rank_3_refuses_rank_2():
    layer = kerasnorm.InstanceNorm(name="inorm")
    layer.build((None, 5, 3))
    with pytest.raises(
        ValueError, match=r"['\"]inorm['\"].*expected min_ndim=3, found ndim=2"
    ):
        layer(random_inputs((2, 3)))


@pytest.mark.parametrize("method", ["build", "compute_output_shape"])
@pytest.mark.parametrize(
    "cls, kwargs, shape, match",
    [
        (kerasnorm.LayerNorm, {"axis": 3}, (None, 4, 5), r"axis 3 is out of bounds"),
        (kerasnorm.LayerNorm, {"axis": [1, -2]}, (None, 4, 5), r"Duplicate axes"),
        (kerasnorm.RMSNorm, {"axis": -4}, (None, 4, 5), r"axis -4 is out of bounds"),
        (
            kerasnorm.RMSNorm,
            {"axis": 1, "partial": 0.5},
            (None, 4, 5),
            r"must include the last axis",
        ),
        (kerasnorm.GroupNorm, {"axis": 3}, (None, 4, 8), r"axis 3 is out of bounds"),
        (kerasnorm.GroupNorm, {"axis": -3}, (None, 4, 8), r"cannot be the batch axis"),
        (kerasnorm.GroupNorm, {"groups": 1}, (8,), r"rank >= 2.*Received: input_sh"),
        (kerasnorm.InstanceNorm, {"axis": 4}, (None, 4, 8), r"axis 4 is out of bounds"),
        (kerasnorm.InstanceNorm, {}, (None, 8), r"rank >= 3.*Received: input_shape"),
    ],
)
def test_build_and_compute_output_shape_refuse_the_same_shapes(
    cls, kwargs, shape, match, method
):
    with pytest.raises(ValueError, match=match):
        getattr(cls(**kwargs), method)(shape)


@pytest.mark.parametrize(
    "layer, shape",
    [
        (kerasnorm.LayerNorm(axis=[1, 2]), (None, 4, 5)),
        (kerasnorm.RMSNorm(partial=0.5), (3, 2, 8)),
        (kerasnorm.GroupNorm(groups=2, axis=1), (None, 4, 3)),
        (kerasnorm.InstanceNorm(), (None, None, None, 3)),
    ],
)
def test_compute_output_shape_of_a_valid_shape(layer, shape):
    assert layer.compute_output_shape(shape) == shape
