"""from_tfa_weights against numpy implementations of TensorFlow Addons' layers.

TensorFlow Addons cannot be installed next to Keras 3; the references below
are its equations, written from its source (tensorflow_addons/layers/
wrappers.py, normalizations.py and rnn/cell.py), on weights in its order.
"""

import keras
import numpy as np
import pytest

from kerasnorm.layers import GroupNorm
from kerasnorm.layers import InstanceNorm
from kerasnorm.layers import LayerNormLSTM
from kerasnorm.layers import LayerNormLSTMCell
from kerasnorm.layers import LayerNormSimpleRNN
from kerasnorm.layers import LayerNormSimpleRNNCell
from kerasnorm.layers import WeightNorm
from kerasnorm.migrate import from_tfa_weights
from tests.support.helpers import random_inputs

L = keras.layers
RNG = np.random.default_rng(0)


def tfa_weight_norm_kernel(g, v):
    """TensorFlow Addons: l2_normalize(v, all axes but the last) * g."""
    axes = tuple(range(v.ndim - 1))
    return g * v / np.sqrt(np.sum(v**2, axis=axes, keepdims=True))


def plain_output(layer, x, kernel, bias):
    twin = type(layer).from_config({**layer.get_config(), "dtype": "float64"})
    twin.build(x.shape)
    twin.kernel.assign(kernel)
    twin.bias.assign(bias)
    return np.asarray(twin(x.astype("float64")))


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: L.Dense(4), (3, 5)),
        (lambda: L.Conv2D(3, 2), (2, 5, 5, 2)),
        (lambda: L.Conv2DTranspose(3, 2, strides=2), (2, 4, 4, 2)),
        (lambda: L.DepthwiseConv2D(3, depth_multiplier=2), (2, 5, 5, 2)),
    ],
    ids=["dense", "conv2d", "conv2d_transpose", "depthwise2d"],
)
def test_weight_norm_computes_what_tfa_computed(make, shape):
    x = random_inputs(shape, seed=1)
    ours = WeightNorm(make())
    ours.build(x.shape)
    kernel_shape = tuple(ours.layer.kernel.shape)
    g = RNG.uniform(0.5, 2.0, kernel_shape[-1])  # TFA: one g per last axis
    v = RNG.standard_normal(kernel_shape)
    bias = RNG.standard_normal(tuple(ours.layer.bias.shape))
    from_tfa_weights(ours, [g, v, bias, np.array(True)])
    expected = plain_output(ours.layer, x, tfa_weight_norm_kernel(g, v), bias)
    np.testing.assert_allclose(np.asarray(ours(x)), expected, atol=1e-5)
    assert float(ours.initialized.numpy()) == 1.0


def test_weight_norm_keeps_g_and_v_where_the_axes_agree():
    ours = WeightNorm(L.Dense(3), data_init=False)
    ours.build((None, 4))
    g, v = RNG.uniform(0.5, 2.0, 3), RNG.standard_normal((4, 3))
    from_tfa_weights(ours, [g, v, np.zeros(3), np.array(False)])
    np.testing.assert_allclose(ours.g.numpy(), g, rtol=1e-6)
    np.testing.assert_allclose(ours.layer.kernel.numpy(), v, rtol=1e-6)


def tfa_group_norm(x, groups, gamma, beta, epsilon=1e-3):
    """TensorFlow Addons' GroupNormalization, channels last."""
    n, c = x.shape[0], x.shape[-1]
    grouped = x.reshape(n, -1, groups, c // groups)
    mean = grouped.mean(axis=(1, 3), keepdims=True)
    var = grouped.var(axis=(1, 3), keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    return normalized * gamma + beta


@pytest.mark.parametrize("groups", [2, 8])
def test_group_and_instance_norm(groups):
    x = random_inputs((2, 4, 4, 8), seed=2).astype("float64")
    gamma, beta = RNG.standard_normal(8), RNG.standard_normal(8)
    ours = (
        GroupNorm(groups, epsilon=1e-3) if groups == 2 else InstanceNorm(epsilon=1e-3)
    )
    ours.build(x.shape)
    from_tfa_weights(ours, [gamma, beta])
    expected = tfa_group_norm(x, groups, gamma, beta)
    np.testing.assert_allclose(
        np.asarray(ours(x.astype("float32"))), expected, atol=1e-5
    )


def layer_norm(x, gamma, beta, epsilon=1e-3):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def tfa_lstm_step(x, h, c, weights):
    """One step of TensorFlow Addons' LayerNormLSTMCell (gate order i f c o);
    the normalized cell state is both the output's input and the new state."""
    kernel, recurrent, bias, kg, kb, rg, rb, sg, sb = weights
    z = layer_norm(x @ kernel, kg, kb) + layer_norm(h @ recurrent, rg, rb) + bias
    i, f, g, o = np.split(z, 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    c = layer_norm(c, sg, sb)
    return sigmoid(o) * np.tanh(c), c, c


def test_lstm_cell_step_matches_tfa_and_keeps_the_unnormalized_state():
    units, dim = 3, 4
    cell = LayerNormLSTMCell(units, norm_epsilon=1e-3)
    cell.build((None, dim))
    weights = [
        RNG.standard_normal(s)
        for s in [(dim, 4 * units), (units, 4 * units), (4 * units,)]
        + [(4 * units,)] * 4
        + [(units,)] * 2
    ]
    from_tfa_weights(cell, weights)
    x = random_inputs((2, dim), seed=3)
    h, c = random_inputs((2, units), seed=4), random_inputs((2, units), seed=5)
    out, (new_h, new_c) = cell(x, [h, c])
    tfa_h, _, tfa_c = tfa_lstm_step(x.astype("float64"), h, c, weights)
    np.testing.assert_allclose(np.asarray(out), tfa_h, atol=1e-5)
    np.testing.assert_allclose(np.asarray(new_h), tfa_h, atol=1e-5)
    # kerasnorm keeps c before its normalization (LN paper Eq. 22): undoing
    # the state LN of TFA's state gives it back.
    sg, sb = weights[7], weights[8]
    raw = np.asarray(new_c)
    np.testing.assert_allclose(layer_norm(raw, sg, sb), tfa_c, atol=1e-5)


def test_lstm_sequence_layer_takes_the_cell_weights():
    layer = LayerNormLSTM(2)
    layer.build((None, 5, 3))
    weights = [w.numpy() + 1.0 for w in layer.cell.weights]
    from_tfa_weights(layer, weights)
    for weight, value in zip(layer.cell.weights, weights, strict=True):
        np.testing.assert_array_equal(weight.numpy(), value)


def tfa_simple_rnn_sequence(x, weights, epsilon=1e-5):
    """TensorFlow Addons' LayerNormSimpleRNNCell over a sequence:
    h_t = tanh(gamma * norm(x_t W + h_{t-1} U) + b), an LN without beta."""
    kernel, recurrent, bias, gamma = weights
    h = np.zeros((x.shape[0], kernel.shape[1]))
    for t in range(x.shape[1]):
        a = x[:, t] @ kernel + h @ recurrent
        mean = a.mean(-1, keepdims=True)
        var = a.var(-1, keepdims=True)
        h = np.tanh(gamma * (a - mean) / np.sqrt(var + epsilon) + bias)
    return h


@pytest.mark.parametrize("wrap", ["cell", "layer"])
def test_simple_rnn_matches_tfa_and_zeroes_beta(wrap):
    units, dim = 3, 4
    if wrap == "cell":
        cell = LayerNormSimpleRNNCell(units)
        layer = keras.layers.RNN(cell)
    else:
        layer = LayerNormSimpleRNN(units)
        cell = layer.cell
    layer.build((None, 5, dim))
    cell.norm_beta.assign(np.ones(units, "float32"))  # must be overwritten
    weights = [
        RNG.standard_normal(s) for s in [(dim, units), (units, units), (units,)]
    ] + [RNG.uniform(0.5, 1.5, units)]
    from_tfa_weights(cell if wrap == "cell" else layer, weights)
    x = random_inputs((2, 5, dim), seed=6)
    np.testing.assert_array_equal(cell.norm_beta.numpy(), np.zeros(units))
    np.testing.assert_allclose(
        np.asarray(layer(x)),
        tfa_simple_rnn_sequence(x.astype("float64"), weights),
        atol=1e-5,
    )


def test_refuses_an_unbuilt_layer():
    with pytest.raises(ValueError, match=r"needs a built layer.*built=False"):
        from_tfa_weights(GroupNorm(2, name="gn"), [])


def test_refuses_other_layers():
    dense = L.Dense(2)
    dense.build((None, 3))
    with pytest.raises(ValueError, match=r"\(class Dense\)"):
        from_tfa_weights(dense, [])


def test_refuses_a_wrong_weight_count():
    norm = GroupNorm(2)
    norm.build((None, 4))
    with pytest.raises(
        ValueError, match=r"expects 2 TensorFlow Addons weights. Received: 1"
    ):
        from_tfa_weights(norm, [np.ones(4)])


def test_refuses_a_wrong_shape():
    norm = GroupNorm(2)
    norm.build((None, 4))
    with pytest.raises(
        ValueError, match=r"has shape \(4,\). Received: an array of shape \(6,\)"
    ):
        from_tfa_weights(norm, [np.ones(6), np.zeros(4)])


def test_refuses_too_few_weight_norm_weights():
    wrapper = WeightNorm(L.Dense(2))
    wrapper.build((None, 3))
    with pytest.raises(ValueError, match=r"at least 3 weights.*Received: 2 arrays"):
        from_tfa_weights(wrapper, [np.ones(2), np.ones((3, 2))])
