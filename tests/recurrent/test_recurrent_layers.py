"""LayerNormSimpleRNN / LayerNormLSTM / LayerNormGRU and their cells against the
float64 step-by-step references of docs/design.md, plus the Keras RNN behaviours
(masking, go_backwards, stateful, dropout, Bidirectional, XLA, TFLite)."""

import inspect
import re

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support import reference_recurrent as ref
from tests.support.backend import BACKEND
from tests.support.backend import value_and_gradients
from tests.support.helpers import random_inputs
from tests.support.helpers import run_layer_test
from tests.support.helpers import tiered

KINDS = {
    "simple_rnn": (
        kerasnorm.LayerNormSimpleRNNCell,
        kerasnorm.LayerNormSimpleRNN,
        ref.simple_rnn_step,
        1,
    ),
    "lstm": (kerasnorm.LayerNormLSTMCell, kerasnorm.LayerNormLSTM, ref.lstm_step, 2),
    "gru": (kerasnorm.LayerNormGRUCell, kerasnorm.LayerNormGRU, ref.gru_step, 1),
}
ALL = sorted(KINDS)


def _randomize(layer, seed=0):
    """Random values for every weight (gains around 1) so that a swapped or
    unused weight changes the result."""
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        shape = tuple(w.shape)
        if w.name.endswith("gamma"):
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        else:
            value = 0.5 * rng.standard_normal(shape)
        w.assign(value.astype(w.dtype))


def _params(layer):
    return {w.name: np.asarray(w.numpy(), np.float64) for w in layer.weights}


def _zero_states(kind, batch, units):
    return [np.zeros((batch, units))] * KINDS[kind][3]


def _reference(kind, layer, x, states=None, mask=None, go_backwards=False):
    cell = layer.cell if hasattr(layer, "cell") else layer
    step_fn = KINDS[kind][2]
    p = _params(cell)
    states = states or _zero_states(kind, x.shape[0], cell.units)
    return ref.run(
        lambda xt, s: step_fn(xt, s, p, cell.norm_epsilon),
        x,
        states,
        mask=mask,
        go_backwards=go_backwards,
    )


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    "batch, steps, features, units, kwargs",
    [
        (3, 5, 4, 6, {}),
        (2, 3, 7, 4, {"use_bias": False, "norm_epsilon": 1e-3}),
        (1, 6, 2, 8, {"go_backwards": True}),
    ],
)
def test_layer_matches_reference(kind, batch, steps, features, units, kwargs):
    x = random_inputs((batch, steps, features), seed=steps, scale=2.0)
    layer = KINDS[kind][1](units, return_sequences=True, return_state=True, **kwargs)
    layer.build(x.shape)
    _randomize(layer, seed=units)
    out, *states = layer(x)
    expected, expected_states = _reference(
        kind, layer, x, go_backwards=kwargs.get("go_backwards", False)
    )
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5)
    for got, want in zip(states, expected_states, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
def test_cell_in_keras_rnn_matches_reference(kind):
    x = random_inputs((3, 4, 5), seed=1)
    cell = KINDS[kind][0](6)
    cell.build((None, 5))
    _randomize(cell, seed=3)
    rng = np.random.default_rng(2)
    init = [rng.standard_normal((3, 6)) for _ in range(KINDS[kind][3])]
    rnn = keras.layers.RNN(cell, return_sequences=True)
    out = rnn(x, initial_state=[s.astype("float32") for s in init])
    expected, _ = _reference(kind, cell, x, states=init)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("masked", [False, True])
def test_sequence_layer_gradients_equal_its_cell_step_by_step(kind, masked):
    """The sequence layer computes the input half once for every step (one
    2-D product over the `(time * batch)` rows) and, on JAX, differentiates
    its time loop keeping only the matmuls' outputs (`jax.checkpoint`); its
    cell in `keras.layers.RNN` does neither. Same weights: same outputs and
    the same gradients for the inputs and every weight, on every backend."""
    x = random_inputs((3, 5, 4), seed=4)
    layer = KINDS[kind][1](6, return_sequences=True)
    layer.build(x.shape)
    _randomize(layer, seed=5)
    by_step = keras.layers.RNN(layer.cell, return_sequences=True)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
    mask = keras.ops.convert_to_tensor(mask) if masked else None
    w = np.random.default_rng(6).standard_normal((3, 5, 6)).astype("float32")
    results = []
    for model in (layer, by_step):

        def loss(inputs, model=model):
            out = model(inputs, mask=mask)
            return keras.ops.sum(keras.ops.multiply(out, w)), [out]

        results.append(
            value_and_gradients(loss, [x], layer.trainable_weights, has_aux=True)
        )
    (v1, (o1,), g1), (v2, (o2,), g2) = results
    np.testing.assert_allclose(o1, o2, atol=1e-5)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    assert len(g1) == 1 + len(layer.trainable_weights)
    for a, b in zip(g1, g2, strict=True):
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ALL)
def test_cells_stack(kind):
    cell_cls = KINDS[kind][0]
    x = random_inputs((2, 3, 4))
    cells = [cell_cls(5), cell_cls(3)]
    out = keras.layers.RNN(keras.layers.StackedRNNCells(cells))(x)
    assert tuple(out.shape) == (2, 3)
    first = keras.layers.RNN(cells[0], return_sequences=True)(x)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(keras.layers.RNN(cells[1])(first)), atol=1e-6
    )


@pytest.mark.parametrize("kind", ALL)
def test_float64_layer_keeps_float64_through_the_loop(kind):
    """A float64 layer returns float64 outputs, states and gradients on every
    backend, traced or not; on JAX a state that changed dtype inside the
    loop made `lax.scan` refuse the carry."""
    x = random_inputs((2, 3, 3), seed=5).astype("float64")
    layer = KINDS[kind][1](3, return_sequences=True, return_state=True)
    layer = type(layer).from_config({**layer.get_config(), "dtype": "float64"})
    layer.build(x.shape)

    def loss(inputs):
        outputs = layer(inputs)
        for tensor in outputs:
            assert keras.backend.standardize_dtype(tensor.dtype) == "float64"
        return keras.ops.sum(outputs[0]), list(outputs)

    _, outputs, grads = value_and_gradients(
        loss, [x], layer.trainable_weights, has_aux=True
    )
    assert [o.dtype for o in outputs] == ["float64"] * len(outputs)
    assert all(np.isfinite(g).all() and g.any() for g in grads)


# Keras 3.15 off TensorFlow rounds a float64 tanh to float32; Keras 3.10
# keeps float64 (the oldest-stack JAX run passes the test there).
_TANH_ROUNDS_FLOAT64 = (
    BACKEND != "tensorflow"
    and keras.backend.standardize_dtype(
        keras.ops.tanh(keras.ops.ones((1,), dtype="float64")).dtype
    )
    != "float64"
)


@pytest.mark.xfail(
    _TANH_ROUNDS_FLOAT64,
    reason="Keras computes float64 in float32 off TensorFlow: its type "
    "promotion maps float64 to float32 (keras.backend.result_type), so the "
    "tanh activation (and on PyTorch matmul and add) round to float32, and "
    "central differences with eps=1e-6 are off by ~1e-3",
    strict=True,
)
@pytest.mark.parametrize("kind", ALL)
def test_gradients_match_finite_differences(kind):
    """float64 layer: autodiff gradients of a scalar loss w.r.t. the input and
    every weight against central differences."""
    x = random_inputs((2, 3, 3), seed=5).astype("float64")
    layer = KINDS[kind][1](3, return_sequences=True, dtype="float64")
    layer.build(x.shape)
    _randomize(layer, seed=7)
    w_out = np.random.default_rng(0).standard_normal((2, 3, 3))

    def loss(inputs):
        return keras.ops.sum(keras.ops.multiply(layer(inputs), w_out))

    def loss_at(target, value):
        """The loss with `target` (None: the input) set to `value`."""
        if target is None:
            return float(loss(value))
        target.assign(value)
        return float(loss(x))

    _, grads = value_and_gradients(loss, [x], layer.trainable_weights)
    eps = 1e-6
    for target, grad in zip([None, *layer.trainable_weights], grads, strict=True):
        base = x if target is None else target.numpy()
        flat_grad = grad.reshape(-1)
        for idx in range(0, base.size, max(1, base.size // 6)):
            bumped = base.reshape(-1).copy()
            bumped[idx] += eps
            up = loss_at(target, bumped.reshape(base.shape))
            bumped[idx] -= 2 * eps
            down = loss_at(target, bumped.reshape(base.shape))
            if target is not None:
                target.assign(base)
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - flat_grad[idx]) < 1e-6 * max(1.0, abs(numeric)), (
                "input" if target is None else target.name,
                idx,
                numeric,
                flat_grad[idx],
            )


@pytest.mark.parametrize("kind", ALL)
def test_masking_matches_unpadded(kind):
    """Right-padded sequences with keras.layers.Masking, or an explicit mask,
    give the final output and states of the unpadded sequences."""
    lengths = [5, 2, 4]
    x = random_inputs((3, 5, 4), seed=9)
    for i, n in enumerate(lengths):
        x[i, n:] = 0.0
    layer = KINDS[kind][1](6, return_state=True)
    layer.build(x.shape)
    _randomize(layer, seed=4)

    inputs = keras.Input((None, 4))
    masked = keras.Model(inputs, layer(keras.layers.Masking(0.0)(inputs)))
    via_masking = masked(x)
    mask = np.arange(5)[None, :] < np.array(lengths)[:, None]
    via_mask = layer(x, mask=mask)
    for i, n in enumerate(lengths):
        alone = layer(x[i : i + 1, :n])
        for got_a, got_b, want in zip(via_masking, via_mask, alone, strict=True):
            np.testing.assert_allclose(np.asarray(got_a)[i], want[0], atol=1e-5)
            np.testing.assert_allclose(np.asarray(got_b)[i], want[0], atol=1e-5)
    expected, expected_states = _reference(kind, layer, x, mask=mask)
    np.testing.assert_allclose(np.asarray(via_mask[0]), expected[:, -1], atol=2e-5)
    for got, want in zip(via_mask[1:], expected_states, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
def test_go_backwards_with_mask_matches_reference(kind):
    x = random_inputs((3, 5, 4), seed=12)
    mask = np.arange(5)[None, :] < np.array([[5], [3], [1]])
    layer = KINDS[kind][1](4, return_sequences=True, go_backwards=True)
    layer.build(x.shape)
    _randomize(layer, seed=5)
    expected, _ = _reference(kind, layer, x, mask=mask, go_backwards=True)
    np.testing.assert_allclose(np.asarray(layer(x, mask=mask)), expected, atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
def test_variable_time_dimension(kind):
    inputs = keras.Input((None, 3))
    model = keras.Model(inputs, KINDS[kind][1](4)(inputs))
    for steps in (2, 7):
        assert tuple(model(random_inputs((2, steps, 3))).shape) == (2, 4)


@pytest.mark.tf_only
@pytest.mark.parametrize("kind", ALL)
def test_traced_at_fixed_batch_any_length_runs_every_step(kind):
    """A graph traced with the batch fixed and the time undefined (a
    `.tflite` file's signature) runs every step: Keras' loop bounded
    itself by the batch size there (one step at batch 1). Checked against
    the float64 step-by-step reference at two lengths."""
    import tensorflow as tf

    layer = KINDS[kind][1](4, return_sequences=True)
    layer.build((1, None, 3))
    _randomize(layer, seed=6)
    traced = tf.function(
        lambda x: layer(x), input_signature=[tf.TensorSpec((1, None, 3))]
    )
    for steps in (5, 9):
        x = random_inputs((1, steps, 3), seed=steps)
        expected, _ = _reference(kind, layer, x)
        np.testing.assert_allclose(np.asarray(traced(x)), expected, atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
def test_dropout_only_in_training(kind):
    x = random_inputs((4, 5, 6))
    layer = KINDS[kind][1](8, dropout=0.5, recurrent_dropout=0.5, seed=1)
    plain = KINDS[kind][1](8)
    layer.build(x.shape)
    plain.build(x.shape)
    plain.set_weights(layer.get_weights())
    inference = np.asarray(layer(x, training=False))
    np.testing.assert_array_equal(inference, np.asarray(layer(x)))
    np.testing.assert_allclose(inference, np.asarray(plain(x)), atol=1e-6)
    first = np.asarray(layer(x, training=True))
    second = np.asarray(layer(x, training=True))
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


@pytest.mark.parametrize("kind", ALL)
def test_recurrent_dropout_alone_acts_in_training(kind):
    x = random_inputs((4, 5, 6))
    layer = KINDS[kind][1](8, recurrent_dropout=0.5, seed=2)
    inference = np.asarray(layer(x))
    assert np.abs(np.asarray(layer(x, training=True)) - inference).max() > 1e-3


@pytest.mark.parametrize("kind", ALL)
def test_stateful_carries_state_and_resets(kind):
    x = random_inputs((2, 6, 3), seed=11)
    inputs = keras.Input((3, 3), batch_size=2)
    layer = KINDS[kind][1](4, stateful=True)
    model = keras.Model(inputs, layer(inputs))
    first = np.asarray(model(x[:, :3]))
    second = np.asarray(model(x[:, 3:]))
    whole = KINDS[kind][1](4)
    whole.build(x.shape)
    whole.set_weights(layer.get_weights())
    np.testing.assert_allclose(second, np.asarray(whole(x)), atol=1e-5)
    layer.reset_states()
    np.testing.assert_allclose(np.asarray(model(x[:, :3])), first, atol=1e-6)


@pytest.mark.parametrize("kind", ALL)
def test_bidirectional(kind):
    x = random_inputs((2, 4, 3))
    layer = keras.layers.Bidirectional(KINDS[kind][1](5, return_sequences=True))
    out = np.asarray(layer(x))
    assert out.shape == (2, 4, 10)
    backward = layer.backward_layer
    assert backward.go_backwards and isinstance(backward, KINDS[kind][1])
    expected, _ = _reference(kind, backward, x, go_backwards=True)
    np.testing.assert_allclose(out[:, :, 5:], expected[:, ::-1], atol=2e-5)


@pytest.mark.parametrize("kind", ALL)
def test_unroll_matches_loop(kind):
    x = random_inputs((2, 4, 3))
    looped = KINDS[kind][1](5, return_sequences=True)
    unrolled = KINDS[kind][1](5, return_sequences=True, unroll=True)
    looped.build(x.shape)
    unrolled.build(x.shape)
    unrolled.set_weights(looped.get_weights())
    np.testing.assert_allclose(
        np.asarray(unrolled(x)), np.asarray(looped(x)), atol=1e-6
    )


# The LSTM, the most used, first: its compiled checks run in the default tier.
@pytest.mark.parametrize(
    "kind, checks",
    tiered(["lstm", "gru", "simple_rnn"]),
)
def test_shared_layer_checks(kind, checks, tmp_path):
    """Config and .keras round trips, shapes, jit == non-jit training, mixed
    precision, TFLite builtins-only parity at batch 1."""
    run_layer_test(
        KINDS[kind][1],
        {"units": 4, "norm_epsilon": 1e-4, "return_sequences": True},
        (6, 4, 3),
        tmp_path,
        checks=checks,
        expected_output_shape=(6, 4, 4),
    )


@pytest.mark.parametrize("kind", ALL)
def test_cell_config_round_trip(kind):
    cls = KINDS[kind][0]
    cell = cls(5, norm_epsilon=1e-3, dropout=0.25, seed=3, use_bias=False)
    config = cell.get_config()
    assert config["norm_epsilon"] == 1e-3 and config["dropout"] == 0.25
    assert cls.from_config(config).get_config() == config


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("use_cell", [True, False])
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"units": 0}, "units"),
        ({"units": 2.5}, "units"),
        ({"units": 4, "norm_epsilon": 0.0}, "norm_epsilon"),
        ({"units": 4, "norm_epsilon": -1e-5}, "norm_epsilon"),
        ({"units": 4, "dropout": 1.0}, "dropout"),
        ({"units": 4, "recurrent_dropout": -0.1}, "recurrent_dropout"),
        ({"units": 4, "dropout": "0.1"}, "dropout"),
    ],
)
def test_bad_arguments(kind, use_cell, kwargs, argument):
    cls = KINDS[kind][0 if use_cell else 1]
    with pytest.raises(ValueError, match=rf"Received: {argument}="):
        cls(**kwargs)


def _valid_outputs(outputs, n, go_backwards):
    """The outputs of the first `n` (valid) steps of a right-padded sequence,
    in the order a run over those `n` steps alone returns them."""
    return outputs[:, outputs.shape[1] - n :] if go_backwards else outputs[:, :n]


def _weighted_sum(results, rows, w_out, w_states, go_backwards):
    """Valid outputs and final states times random weights, summed over
    `rows`: (row of the weights, valid length) for each batch entry."""
    out, *states = results
    total = 0.0
    for k, (row, n) in enumerate(rows):
        if len(out.shape) == 3:
            valid = _valid_outputs(out[k : k + 1], n, go_backwards)[0]
            total += keras.ops.sum(keras.ops.multiply(valid, w_out[row, :n]))
        else:
            total += keras.ops.sum(keras.ops.multiply(out[k], w_out[row, 0]))
        for s, w in zip(states, w_states, strict=True):
            total += keras.ops.sum(keras.ops.multiply(s[k], w[row]))
    return total


def _value_and_grads(layer, inputs, mask, loss_fn):
    """`loss_fn(layer(inputs))`, the layer's results and the gradients with
    respect to the inputs and every trainable weight."""

    def loss(x):
        results = layer(x, mask=mask)
        return loss_fn(results), list(results)

    return value_and_gradients(loss, [inputs], layer.trainable_weights, has_aux=True)


# A pairwise cover of kind x go_backwards x return_sequences in the default
# tier (each kind in both directions and both output forms, every direction
# with both forms), the rest of the product in the slow tier: each case
# differentiates five shapes, and on JAX each compiles its own programs.
_NON_FINITE = [
    (kind, go_backwards, return_sequences)
    for kind in ALL
    for go_backwards in (False, True)
    for return_sequences in (False, True)
]
_NON_FINITE_COVER = {
    (kind, directions, directions ^ (i % 2 == 1))
    for i, kind in enumerate(ALL)
    for directions in (False, True)
}


@pytest.mark.parametrize(
    "kind, go_backwards, return_sequences",
    [
        pytest.param(
            *case,
            marks=() if case in _NON_FINITE_COVER else pytest.mark.slow,
            id="-".join(map(str, case)),
        )
        for case in _NON_FINITE
    ],
)
def test_non_finite_padding_stays_out_of_outputs_and_gradients(
    kind, go_backwards, return_sequences
):
    """NaN, inf and -inf in masked steps. Reference, with no mask involved:
    each sequence run alone over its valid steps. The valid outputs, the
    final states and the gradients (inputs at valid steps, every weight)
    equal it and are finite; padded inputs get a zero gradient; every output
    equals that of the same sequences padded with zeros."""
    steps, lengths = 5, [5, 2, 3]
    x = random_inputs((3, steps, 4), seed=21)
    mask = np.arange(steps)[None, :] < np.array(lengths)[:, None]
    zero_padded = np.where(mask[:, :, None], x, 0.0).astype("float32")
    x[1, 2:] = np.nan
    x[2, 3] = np.inf
    x[2, 4] = -np.inf
    layer = KINDS[kind][1](
        6,
        return_sequences=return_sequences,
        return_state=True,
        go_backwards=go_backwards,
    )
    layer.build(x.shape)
    _randomize(layer, seed=8)
    rng = np.random.default_rng(3)
    w_out = rng.standard_normal((3, steps, 6)).astype("float32")
    w_states = rng.standard_normal((KINDS[kind][3], 3, 6)).astype("float32")

    def loss_fn(rows):
        return lambda results: _weighted_sum(
            results, rows, w_out, w_states, go_backwards
        )

    every_row = loss_fn(list(enumerate(lengths)))
    value, results, grads = _value_and_grads(layer, x, mask, every_row)
    for got in [value, *results, *grads]:
        assert np.all(np.isfinite(got))
    _, zero_results, _ = _value_and_grads(layer, zero_padded, mask, every_row)
    for got, want in zip(results, zero_results, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)

    expected_value = 0.0
    expected_weight_grads = [np.zeros(g.shape) for g in grads[1:]]
    for i, n in enumerate(lengths):
        alone_value, alone, alone_grads = _value_and_grads(
            layer, x[i : i + 1, :n], None, loss_fn([(i, n)])
        )
        expected_value += float(alone_value)
        out = results[0][i : i + 1]
        if return_sequences:
            out = _valid_outputs(out, n, go_backwards)
        np.testing.assert_allclose(out, alone[0], atol=1e-5)
        for got, want in zip(results[1:], alone[1:], strict=True):
            np.testing.assert_allclose(got[i], want[0], atol=1e-5)
        np.testing.assert_allclose(grads[0][i, :n], alone_grads[0][0], atol=1e-4)
        np.testing.assert_array_equal(grads[0][i, n:], 0.0)
        for total, g in zip(expected_weight_grads, alone_grads[1:], strict=True):
            total += g
    # float32 sums in another order: the outputs' tolerance, absolute.
    np.testing.assert_allclose(float(value), expected_value, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads[1:], expected_weight_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("kind", ALL)
def test_masking_layer_with_inf_reaching_padded_steps(kind):
    """Masking(0) then log: the padded steps hold -inf and carry the Masking
    layer's mask. The loss and the weight gradients are finite and equal the
    sum over the sequences run alone over their valid steps."""
    lengths = [4, 1, 3]
    x = np.abs(random_inputs((3, 4, 3), seed=30)) + 0.5
    for i, n in enumerate(lengths):
        x[i, n:] = 0.0
    layer = KINDS[kind][1](5)
    inputs = keras.Input((None, 3))
    logged = keras.layers.Activation(keras.ops.log)(keras.layers.Masking(0.0)(inputs))
    model = keras.Model(inputs, layer(logged))
    _randomize(layer, seed=2)
    w = np.random.default_rng(4).standard_normal((3, 5)).astype("float32")

    def value_and_grads(data, rows):
        value, (_, *grads) = value_and_gradients(
            lambda x: keras.ops.sum(keras.ops.multiply(model(x), w[rows])),
            [data],
            layer.trainable_weights,
        )
        return value, grads

    value, grads = value_and_grads(x, slice(None))
    expected_value = 0.0
    expected = [np.zeros(tuple(g.shape)) for g in grads]
    for i, n in enumerate(lengths):
        alone_value, alone = value_and_grads(x[i : i + 1, :n], slice(i, i + 1))
        expected_value += alone_value
        for total, g in zip(expected, alone, strict=True):
            total += np.asarray(g)
    assert np.isfinite(value)
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    for got, want in zip(grads, expected, strict=True):
        assert np.all(np.isfinite(np.asarray(got)))
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


NORMS = {
    "simple_rnn": ["norm_"],
    "lstm": ["input_norm_", "recurrent_norm_", "cell_norm_"],
    "gru": ["input_norm_", "recurrent_norm_"],
}


def _norm_weights(cell, kind, which):
    return [getattr(cell, f"{prefix}{which}") for prefix in NORMS[kind]]


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("use_cell", [True, False])
def test_norm_regularizers_add_their_losses(kind, use_cell):
    cls = KINDS[kind][0 if use_cell else 1]
    layer = cls(
        4,
        norm_gamma_regularizer=keras.regularizers.L2(0.3),
        norm_beta_regularizer=keras.regularizers.L1(0.2),
    )
    inputs = keras.Input((3, 2))
    outputs = (keras.layers.RNN(layer) if use_cell else layer)(inputs)
    model = keras.Model(inputs, outputs)
    cell = layer if use_cell else layer.cell
    _randomize(cell, seed=6)
    gammas = [w.numpy() for w in _norm_weights(cell, kind, "gamma")]
    betas = [w.numpy() for w in _norm_weights(cell, kind, "beta")]
    expected = 0.3 * sum(np.sum(g**2) for g in gammas) + 0.2 * sum(
        np.sum(np.abs(b)) for b in betas
    )
    assert len(model.losses) == 2 * len(NORMS[kind])
    np.testing.assert_allclose(
        float(sum(float(loss) for loss in model.losses)), expected, rtol=1e-5
    )
    restored = cls.from_config(layer.get_config())
    restored_cell = restored if use_cell else restored.cell
    assert restored_cell.norm_gamma_regularizer.get_config() == {"l2": 0.3}
    np.testing.assert_allclose(restored_cell.norm_beta_regularizer.l1, 0.2)


@pytest.mark.parametrize("kind", ALL)
def test_norm_constraints_apply_after_an_optimizer_step(kind):
    layer = KINDS[kind][1](
        4,
        norm_gamma_constraint=keras.constraints.NonNeg(),
        norm_beta_constraint=keras.constraints.MaxNorm(0.5, axis=0),
    )
    model = keras.Sequential([keras.Input((3, 2)), layer, keras.layers.Dense(1)])
    cell = layer.cell
    for gamma in _norm_weights(cell, kind, "gamma"):
        signs = np.where(np.arange(gamma.shape[0]) % 2 == 0, 1.0, -1.0)
        gamma.assign(signs.astype("float32"))
    for beta in _norm_weights(cell, kind, "beta"):
        beta.assign(np.full(tuple(beta.shape), 2.0, "float32"))
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    x, y = random_inputs((4, 3, 2)), random_inputs((4, 1), seed=1)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)

    for gamma in _norm_weights(cell, kind, "gamma"):
        g = gamma.numpy()
        np.testing.assert_array_equal(g[1::2], 0.0)
        np.testing.assert_allclose(g[0::2], 1.0, atol=1e-2)
    for beta in _norm_weights(cell, kind, "beta"):
        np.testing.assert_allclose(np.linalg.norm(beta.numpy()), 0.5, rtol=1e-4)
    assert np.any(cell.kernel.numpy() < 0), "the kernel must stay unconstrained"
    config = layer.get_config()
    restored = KINDS[kind][1].from_config(config).cell
    assert isinstance(restored.norm_gamma_constraint, keras.constraints.NonNeg)
    assert restored.norm_beta_constraint.get_config() == {
        "max_value": 0.5,
        "axis": 0,
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ALL)
def test_cell_shared_layer_checks(kind, tmp_path):
    """The cells in keras.layers.RNN: config and .keras round trips, shapes,
    jit == non-jit training, mixed precision, TFLite builtins-only parity."""
    run_layer_test(
        KINDS[kind][0],
        {
            "units": 4,
            "norm_epsilon": 1e-4,
            "norm_gamma_regularizer": keras.regularizers.L2(0.01),
        },
        (6, 4, 3),
        tmp_path,
        expected_output_shape=(6, 4, 4),
        wrap=lambda cell: keras.layers.RNN(cell, return_sequences=True),
    )


@pytest.mark.parametrize(
    "name",
    [
        "LayerNormSimpleRNN",
        "LayerNormLSTM",
        "LayerNormGRU",
        "LayerNormSimpleRNNCell",
        "LayerNormLSTMCell",
        "LayerNormGRUCell",
    ],
)
def test_docstring_lists_every_constructor_argument(name):
    """Each argument its own `Args:` entry, as in Keras' LSTM docstring."""
    cls = getattr(kerasnorm, name)
    parameters = inspect.signature(cls.__init__).parameters
    arguments = [p for p in parameters if p not in ("self", "kwargs")]
    section = cls.__doc__.split("Args:")[1].split("Call arguments:")[0]
    documented = re.findall(r"^        (\w+):", section, re.M)
    assert documented == arguments
