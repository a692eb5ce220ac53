"""Keras LSTM/GRU/SimpleRNN weights load into the LN layers unchanged.

With every LN made (numerically) the identity — kernels whose rows sum to zero
within each LN group, so the normalized pre-activations have mean 0, and
epsilon = 1e8 with gain sqrt(epsilon), so the division by sqrt(var + eps) is a
multiplication by 1 in float32 — a LN layer carrying a Keras layer's weights
must compute what the Keras layer computes. That checks the layout and the gate
order, not only the shapes.
"""

import keras
import numpy as np

import kerasnorm
from tests.helpers import random_inputs

EPS = 1e8
GAIN = 1e4  # sqrt(EPS)


def _centre_rows(w, groups):
    """Make every row of `w` sum to zero within each column group."""
    w = np.array(w)
    start = 0
    for size in groups:
        block = w[:, start : start + size]
        w[:, start : start + size] = block - block.mean(axis=1, keepdims=True)
        start += size
    return w


def _random_keras(layer, shape, groups, seed):
    layer.build(shape)
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        value = 0.5 * rng.standard_normal(tuple(w.shape))
        if w.name in ("kernel", "recurrent_kernel"):
            value = _centre_rows(value, groups)
        w.assign(value.astype("float32"))


def _neutral_norms(layer):
    for w in layer.weights:
        if w.name.endswith("gamma"):
            w.assign(np.full(tuple(w.shape), GAIN, "float32"))
        elif w.name.endswith("beta"):
            w.assign(np.zeros(tuple(w.shape), "float32"))


def test_keras_lstm_weights_into_layer_norm_lstm():
    units, features = 5, 3
    x = random_inputs((1, 1, features), seed=1)
    rng = np.random.default_rng(2)
    h0, c0 = (rng.standard_normal((1, units)).astype("float32") for _ in range(2))
    lstm = keras.layers.LSTM(units, return_state=True)
    _random_keras(lstm, x.shape, [4 * units], seed=3)

    ln = kerasnorm.LayerNormLSTM(units, return_state=True, norm_epsilon=EPS)
    ln.build(x.shape)
    # The documented recipe: Keras' three weights first, the LN weights kept.
    ln.set_weights(lstm.get_weights() + ln.get_weights()[3:])
    for name in ("kernel", "recurrent_kernel", "bias"):
        np.testing.assert_array_equal(
            getattr(ln.cell, name).numpy(), getattr(lstm.cell, name).numpy()
        )
    _neutral_norms(ln)

    h, _, c = (np.asarray(t) for t in lstm(x, initial_state=[h0, c0]))
    # LN_c subtracts the mean of c; with batch 1 its bias can add it back.
    ln.cell.cell_norm_beta.assign(np.full((units,), c.mean(), "float32"))
    ln_h, ln_h_state, ln_c = (np.asarray(t) for t in ln(x, initial_state=[h0, c0]))
    np.testing.assert_allclose(ln_c, c, atol=1e-5)
    np.testing.assert_allclose(ln_h, h, atol=1e-5)
    np.testing.assert_array_equal(ln_h, ln_h_state)


def test_keras_gru_weights_into_layer_norm_gru():
    units, features = 4, 3
    x = random_inputs((2, 5, features), seed=4)
    gru = keras.layers.GRU(units, return_sequences=True)
    _random_keras(gru, x.shape, [2 * units, units], seed=5)
    bias = gru.cell.bias.numpy()
    # Keras' recurrent bias of the candidate sits inside r * (...); LN-GRU has
    # no such term (LN_h2's bias takes its role), so it is zero here.
    bias[1, 2 * units :] = 0.0
    gru.cell.bias.assign(bias)

    ln = kerasnorm.LayerNormGRU(units, return_sequences=True, norm_epsilon=EPS)
    ln.build(x.shape)
    ln.cell.kernel.assign(gru.cell.kernel)
    ln.cell.recurrent_kernel.assign(gru.cell.recurrent_kernel)
    ln.cell.bias.assign(bias[0] + bias[1])
    _neutral_norms(ln)
    np.testing.assert_allclose(np.asarray(ln(x)), np.asarray(gru(x)), atol=1e-5)


def test_keras_simple_rnn_weights_into_layer_norm_simple_rnn():
    units, features = 4, 3
    x = random_inputs((2, 5, features), seed=6)
    rnn = keras.layers.SimpleRNN(units, return_sequences=True)
    _random_keras(rnn, x.shape, [units], seed=7)

    ln = kerasnorm.LayerNormSimpleRNN(units, return_sequences=True, norm_epsilon=EPS)
    ln.build(x.shape)
    ln.set_weights(rnn.get_weights() + ln.get_weights()[3:])
    _neutral_norms(ln)
    np.testing.assert_allclose(np.asarray(ln(x)), np.asarray(rnn(x)), atol=1e-5)


def test_transferred_lstm_trains():
    """The usual use: start a LayerNormLSTM from a Keras LSTM's kernels (LN
    weights at their defaults) and fine-tune it."""
    x = random_inputs((8, 6, 3), seed=8)
    y = random_inputs((8, 1), seed=9)
    lstm = keras.layers.LSTM(4)
    lstm.build(x.shape)
    ln = kerasnorm.LayerNormLSTM(4)
    ln.build(x.shape)
    ln.set_weights(lstm.get_weights() + ln.get_weights()[3:])
    model = keras.Sequential([keras.Input((6, 3)), ln, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    losses = model.fit(x, y, epochs=5, batch_size=8, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
