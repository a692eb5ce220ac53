"""Keras masks: padded positions never reach valid ones, whatever they hold.

The reference for every padded batch is the same layer (same weights, cut to
the valid length where they run along time) run on each example cut to its
valid length, with no mask: padding must not change a valid output, nor the
gradient of a loss over valid outputs with respect to the valid inputs,
`gamma` and `beta`.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support import reference
from tests.support.backend import value_and_gradients
from tests.support.helpers import random_inputs

# (class, kwargs, input shape, mask rank). The mask covers the leading axes.
CASES = [
    (kerasnorm.LayerNorm, {"axis": [1, 2]}, (2, 6, 4), 2),  # statistics over time
    (kerasnorm.LayerNorm, {}, (2, 6, 4), 2),  # per-step statistics
    (kerasnorm.RMSNorm, {"axis": [1, 2], "center": True}, (2, 6, 4), 2),
    (kerasnorm.RMSNorm, {"axis": [1, 2], "partial": 0.5}, (2, 6, 4), 2),
    (kerasnorm.GroupNorm, {"groups": 2}, (2, 6, 4), 2),
    (kerasnorm.GroupNorm, {"groups": 2}, (2, 6, 3, 4), 2),  # (batch, height)
    (kerasnorm.GroupNorm, {"groups": 2}, (2, 6, 3, 4), 3),  # (batch, h, w)
    (kerasnorm.InstanceNorm, {}, (2, 6, 4), 2),
    (kerasnorm.InstanceNorm, {}, (2, 6, 3, 4), 2),
]
LENGTHS = (6, 4)


def _ids(case):
    cls, kwargs, shape, mask_rank = case
    return f"{cls.__name__}-{kwargs}-{shape}-mask{mask_rank}"


def _layer(cls, kwargs, shape):
    layer = cls(**kwargs)
    layer.build((None, *shape[1:]))
    rng = np.random.default_rng(3)
    for w in layer.weights:
        w.assign(rng.standard_normal(w.shape).astype("float32"))
    return layer


def _mask(shape, mask_rank):
    """Example 0 is whole; example 1 is padded from step LENGTHS[1] on (and,
    for a rank-3 mask, also in its last column)."""
    mask = np.ones(shape[:mask_rank], bool)
    mask[1, LENGTHS[1] :] = False
    if mask_rank == 3:
        mask[1, :, -1] = False
    return mask


def _valid_slice(n, mask_rank, shape):
    index = (slice(n, n + 1), slice(0, LENGTHS[n]))
    if mask_rank == 3 and n == 1:
        index += (slice(0, shape[2] - 1),)
    return index


def _cut_layer(layer, cls, kwargs, x_cut, n):
    """`layer` for one example cut to its valid length: the same weights,
    cut along time where the parameters run over time (LayerNorm and RMSNorm
    with `axis=[1, 2]`)."""
    if not (isinstance(layer.axis, list) and 1 in layer.axis):
        return layer, ()
    cut = cls(**kwargs)
    cut.build((None, *x_cut.shape[1:]))
    index = (slice(0, LENGTHS[n]),)
    for w_cut, w in zip(cut.weights, layer.weights, strict=True):
        w_cut.assign(np.asarray(w)[index])
    return cut, index


def _loss_and_grads(layer, x, weight, mask=None):
    def loss(inputs):
        y = layer(inputs, mask=mask)
        return keras.ops.sum(keras.ops.multiply(y, weight)), [y]

    _, (y,), grads = value_and_gradients(loss, [x], layer.weights, has_aux=True)
    return y, grads


@pytest.mark.parametrize("pad", [np.nan, np.inf, -np.inf], ids=str)
@pytest.mark.parametrize("cls, kwargs, shape, mask_rank", CASES, ids=map(_ids, CASES))
def test_padding_never_reaches_valid_positions(cls, kwargs, shape, mask_rank, pad):
    layer = _layer(cls, kwargs, shape)
    x = random_inputs(shape, offset=1.0, scale=2.0)
    mask = _mask(shape, mask_rank)
    valid = np.broadcast_to(
        np.reshape(mask, mask.shape + (1,) * (len(shape) - mask_rank)), shape
    )
    padded = np.where(valid, x, np.float32(pad))
    # A masked loss as Keras computes one: a product with the mask, which is
    # NaN wherever a padded output is not finite.
    weight = random_inputs(shape, seed=7) * valid
    y, grads = _loss_and_grads(layer, padded, weight, mask=mask)
    y, grad_x = np.asarray(y), np.asarray(grads[0])
    assert np.all(np.isfinite(y)), "padded outputs must be finite"
    np.testing.assert_array_equal(grad_x[~valid], 0.0)
    expected_param_grads = [np.zeros(w.shape) for w in layer.weights]
    for n in range(2):
        index = _valid_slice(n, mask_rank, shape)
        cut, param_index = _cut_layer(layer, cls, kwargs, x[index], n)
        ref_y, ref_grads = _loss_and_grads(cut, x[index], weight[index])
        np.testing.assert_allclose(y[index], np.asarray(ref_y), atol=1e-5)
        np.testing.assert_allclose(grad_x[index], np.asarray(ref_grads[0]), atol=1e-4)
        for total, g in zip(expected_param_grads, ref_grads[1:], strict=True):
            total[param_index] += np.asarray(g)
    assert len(grads) == 1 + len(layer.weights) > 1
    for got, expected in zip(grads[1:], expected_param_grads, strict=True):
        assert np.all(np.isfinite(np.asarray(got)))
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4)


@pytest.mark.parametrize("shape, mask_rank", [((2, 6, 3, 4), 2), ((2, 6, 4), 2)])
def test_group_norm_with_one_channel_per_group_is_instance_norm_under_a_mask(
    shape, mask_rank
):
    x = random_inputs(shape, offset=-1.0)
    mask = _mask(shape, mask_rank)
    gn = _layer(kerasnorm.GroupNorm, {"groups": shape[-1]}, shape)
    inorm = _layer(kerasnorm.InstanceNorm, {}, shape)
    for w_in, w_gn in zip(inorm.weights, gn.weights, strict=True):
        w_in.assign(w_gn)
    np.testing.assert_allclose(
        np.asarray(gn(x, mask=mask)), np.asarray(inorm(x, mask=mask)), atol=1e-5
    )


def test_group_norm_height_mask_matches_numpy_reference():
    """The case that crashed with a broadcast error: rank 4, (batch, height)."""
    x = random_inputs((2, 6, 3, 4), offset=2.0)
    mask = _mask(x.shape, 2)
    y = np.asarray(kerasnorm.GroupNorm(groups=2)(x, mask=mask))
    for n, length in enumerate(LENGTHS):
        expected = reference.group_norm(x[n : n + 1, :length], 2, -1, 1e-5)
        np.testing.assert_allclose(y[n : n + 1, :length], expected, atol=2e-5)


def test_masked_nan_padding_under_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    layer = kerasnorm.GroupNorm(groups=2)
    x = random_inputs((2, 6, 4)).astype("float16")
    mask = _mask(x.shape, 2)
    padded = x.copy()
    padded[1, LENGTHS[1] :] = np.nan
    y = np.asarray(layer(padded, mask=mask), "float32")
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(
        y[1:, : LENGTHS[1]],
        np.asarray(layer(x[1:, : LENGTHS[1]]), "float32"),
        atol=1e-3,
    )


@pytest.mark.parametrize(
    "cls, kwargs, shape",
    [
        (kerasnorm.GroupNorm, {"groups": 2, "axis": 1}, (2, 4, 3)),
        (kerasnorm.InstanceNorm, {"axis": 1}, (2, 3, 4)),
        (kerasnorm.InstanceNorm, {"axis": 2}, (2, 3, 4, 5)),
    ],
)
def test_mask_over_the_channel_axis_is_refused(cls, kwargs, shape):
    layer = cls(**kwargs)
    mask = np.ones(shape[: kwargs["axis"] + 1], bool)
    with pytest.raises(
        ValueError,
        match=rf"only over axes before the channel axis.*Received: "
        rf"axis={kwargs['axis']} with a mask of shape \({shape[0]}, ",
    ):
        layer(random_inputs(shape), mask=mask)
