"""Streaming exports: one time step per call, states carried by the caller.

The step files are checked against independent references: the float64
numpy cells written from the equations (tests/support/reference_recurrent.py), and
the Keras sequence model itself (the step run over every prefix of the
sequence). Across two graphs (the TFLite step against Keras or numpy) the
comparison has a tolerance: float32 rounding over a few steps stays near
1e-6 of the output scale, so 1e-5 separates rounding from a wrong step.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasnorm
from kerasnorm.export import ExportConversionError
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.inputs.data import RANDOM_SAMPLES
from kerasnorm_cli import command as main
from kerasnorm_cli.exits import EXIT_CONVERSION
from tests.support import reference_recurrent as ref

pytestmark = pytest.mark.tf_only

L = keras.layers
STEPS, FEATURES = 8, 4

KINDS = {
    "simple_rnn": (kerasnorm.LayerNormSimpleRNN, ref.simple_rnn_step, 1),
    "lstm": (kerasnorm.LayerNormLSTM, ref.lstm_step, 2),
    "gru": (kerasnorm.LayerNormGRU, ref.gru_step, 1),
}


def _sequences(n, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, steps, FEATURES)).astype("float32")


def _randomize(layer, seed=1):
    """Gains near 1 and non-zero biases, so a swapped weight shows."""
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        scale = 0.3 if "gamma" in w.name else 0.5
        offset = 1.0 if "gamma" in w.name else 0.0
        w.assign((offset + scale * rng.standard_normal(w.shape)).astype("float32"))


def _steps(path, x):
    with open(path, "rb") as f:
        runner = litert.StreamingRunner(f.read())
    return runner, runner.run(x)


@pytest.mark.parametrize(
    "kind",
    [
        k if k == "lstm" else pytest.param(k, marks=pytest.mark.slow)
        for k in sorted(KINDS)
    ],
)
def test_step_file_matches_numpy_cells(kind, tmp_path):
    cls, step_fn, n_states = KINDS[kind]
    layer = cls(5, return_sequences=True, name="rec")
    model = keras.Sequential([keras.Input((STEPS, FEATURES)), layer])
    _randomize(layer)
    path = tmp_path / "step.tflite"
    result = to_tflite(model, path, streaming=True, batch_size=2)
    assert result.verification.criterion == "max"

    x = _sequences(2, seed=3)
    runner, (outputs,) = _steps(path, x)
    p = {w.name: np.asarray(w.numpy(), np.float64) for w in layer.cell.weights}
    want, states = ref.run(
        lambda xt, s: step_fn(xt, s, p, layer.cell.norm_epsilon),
        x,
        [np.zeros((2, 5))] * n_states,
    )
    scale = np.abs(want).max()
    np.testing.assert_allclose(outputs, want, atol=1e-5 * scale)
    names = tuple(f"state_rec_{i}" for i in range(n_states))
    assert runner.state_names == names and runner.output_names == ("output_0",)
    for name, state in zip(names, states, strict=True):
        np.testing.assert_allclose(runner.states[name], state, atol=1e-5 * scale)
    assert not any(
        op.startswith(("Flex", "WHILE")) for op in litert.op_names(path.read_bytes())
    )


def _stack(last_sequences=False, steps=None):
    """Two stacked LN layers with per-step layers around them."""
    return keras.Sequential(
        [
            keras.Input((steps, FEATURES), name="frames"),
            L.Dense(6, activation="relu"),
            kerasnorm.LayerNorm(),
            kerasnorm.LayerNormLSTM(6, return_sequences=True, name="lstm1"),
            L.Dropout(0.2),
            kerasnorm.RMSNorm(),
            kerasnorm.LayerNormGRU(5, return_sequences=last_sequences, name="gru2"),
            L.Dense(3),
            L.Softmax(),
        ]
    )


def test_stack_with_last_output_is_the_model_on_every_prefix(tmp_path):
    """After return_sequences=False the step outputs, at step t, what the
    sequence model outputs for the sequence that ends at t."""
    keras.utils.set_random_seed(0)
    model = _stack()
    path = tmp_path / "stack.tflite"
    result = to_tflite(model, path, streaming=True)  # undefined time axis
    assert result.verification.samples == RANDOM_SAMPLES
    x = _sequences(1, steps=6, seed=4)
    runner, (outputs,) = _steps(path, x)
    assert runner.state_names == (
        "state_gru2_0",
        "state_lstm1_0",
        "state_lstm1_1",
    )
    want = np.stack([model(x[:, : t + 1]).numpy() for t in range(6)], axis=1)
    np.testing.assert_allclose(outputs, want, atol=1e-5)


def test_runner_carries_states_across_calls_and_resets(tmp_path):
    keras.utils.set_random_seed(0)
    path = tmp_path / "stack.tflite"
    to_tflite(_stack(last_sequences=True, steps=STEPS), path, streaming=True)
    x = _sequences(1, seed=5)
    runner, (whole,) = _steps(path, x)
    # Same interpreter, same inputs: exactly the same numbers.
    runner.reset()
    assert all(not s.any() for s in runner.states.values())
    (first,) = runner.run(x[:, :3])
    (rest,) = runner.run(x[:, 3:])
    np.testing.assert_array_equal(np.concatenate([first, rest], axis=1), whole)
    runner.reset()
    np.testing.assert_array_equal(runner.step(x[:, 0])[0], whole[:, 0])
    with pytest.raises(ValueError, match=r"shape \(1, 4\).*Received shape \(2, 4\)"):
        runner.step(np.zeros((2, FEATURES), "float32"))


@pytest.mark.parametrize(
    "make",
    [
        lambda: L.LSTM(5, return_sequences=True),
        pytest.param(lambda: L.GRU(5, return_sequences=True), marks=pytest.mark.slow),
        pytest.param(
            lambda: L.SimpleRNN(5, return_sequences=True), marks=pytest.mark.slow
        ),
        lambda: L.RNN(kerasnorm.LayerNormLSTMCell(5), return_sequences=True),
    ],
    ids=["keras_lstm", "keras_gru", "keras_simple_rnn", "rnn_of_ln_cell"],
)
def test_keras_recurrent_layers_and_cells(make, tmp_path):
    keras.utils.set_random_seed(0)
    layer = make()
    model = keras.Sequential([keras.Input((STEPS, FEATURES)), layer, L.Dense(2)])
    _randomize(layer)
    path = tmp_path / "keras.tflite"
    to_tflite(model, path, streaming=True)
    x = _sequences(1, seed=6)
    _, (outputs,) = _steps(path, x)
    want = model(x).numpy()
    np.testing.assert_allclose(outputs, want, atol=1e-5 * np.abs(want).max())


def _trained(make_recurrent, seed=0):
    """A model trained to output the running sum of two features: its output
    depends on the state, and has a signal int8 can resolve."""
    keras.utils.set_random_seed(seed)
    x = _sequences(256, seed=seed)
    y = np.cumsum(x[..., :2], axis=1) / 3
    model = keras.Sequential(
        [keras.Input((STEPS, FEATURES)), *make_recurrent(), L.Dense(2)]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x, y, epochs=15, batch_size=32, verbose=0)
    return model, x


@pytest.mark.parametrize(
    "make",
    [
        # Each trains a model and calibrates it: the default tier runs the
        # stack of an LN-LSTM and an LN-GRU, the slow tier each kind alone.
        pytest.param(
            lambda: [kerasnorm.LayerNormSimpleRNN(16, return_sequences=True)],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda: [kerasnorm.LayerNormLSTM(16, return_sequences=True)],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda: [kerasnorm.LayerNormGRU(16, return_sequences=True)],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda: [L.LSTM(16, return_sequences=True)], marks=pytest.mark.slow
        ),
        lambda: [
            kerasnorm.LayerNormLSTM(16, return_sequences=True),
            kerasnorm.LayerNormGRU(16, return_sequences=True),
        ],
    ],
    ids=["ln_simple_rnn", "ln_lstm", "ln_gru", "keras_lstm", "two_layers"],
)
def test_int8_step_is_full_integer_and_within_the_rms_criterion(make, tmp_path):
    """A rolled LSTM at int8 is refused without streaming (the calibration
    crashes on its loop); the step has no loop and converts."""
    model, x = _trained(make)
    path = tmp_path / "step.int8.tflite"
    result = to_tflite(
        model, path, streaming=True, quantize="int8", representative_data=x
    )
    check = result.verification
    assert check.criterion == "rms" and check.passed, check
    ops = litert.op_names(path.read_bytes())
    assert "QUANTIZE" in ops and "FULLY_CONNECTED" in ops
    # Independent of the export's own check: the int8 steps against Keras.
    runner = litert.StreamingRunner(path.read_bytes())
    outputs = []
    for sequence in x[:64]:
        runner.reset()
        outputs.append(runner.run(sequence[None])[0])
    outputs = np.concatenate(outputs)
    want = model(x[:64]).numpy()
    rms = np.sqrt(np.mean((outputs - want) ** 2)) / np.sqrt(np.mean(want**2))
    assert rms < 0.1


def test_failed_parity_check_leaves_nothing(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((STEPS, FEATURES)), kerasnorm.LayerNormLSTM(4), L.Dense(2)]
    )
    path = tmp_path / "step.tflite"
    with pytest.raises(ExportVerificationError, match="Streaming parity check"):
        to_tflite(model, path, streaming=True, quantize="float16", tolerance=1e-9)
    assert os.listdir(tmp_path) == []


def test_saved_model_step_signature(tmp_path):
    keras.utils.set_random_seed(0)
    model = _stack(last_sequences=True, steps=STEPS)
    result = to_saved_model(model, tmp_path / "served", streaming=True)
    assert result.path == str(tmp_path / "served" / "1")
    fn = tf.saved_model.load(result.path).signatures["serving_default"]
    _, inputs = fn.structured_input_signature
    assert {k: tuple(v.shape) for k, v in inputs.items()} == {
        "x": (None, FEATURES),
        "state_lstm1_0": (None, 6),
        "state_lstm1_1": (None, 6),
        "state_gru2_0": (None, 5),
    }
    states = sorted(k for k in inputs if k != "x")
    assert sorted(fn.structured_outputs) == ["output_0", *states]
    # Three streams side by side (the batch dimension is dynamic).
    x = _sequences(3, seed=7)
    states = {k: tf.zeros((3, v.shape[1])) for k, v in inputs.items() if k != "x"}
    outputs = []
    for t in range(STEPS):
        result = fn(x=tf.constant(x[:, t]), **states)
        states = {k: result[k] for k in states}
        outputs.append(result["output_0"].numpy())
    want = model(x).numpy()
    np.testing.assert_allclose(np.stack(outputs, axis=1), want, atol=1e-5)


REFUSED = [
    (lambda: L.Conv1D(4, 3, padding="causal"), "convolves over time"),
    (lambda: L.GlobalAveragePooling1D(), "pools over the time axis"),
    (lambda: L.MaxPooling1D(2), "pools over the time axis"),
    (lambda: L.LSTM(4, go_backwards=True), "runs with go_backwards=True"),
    (lambda: L.Bidirectional(L.LSTM(4)), "is bidirectional"),
    (lambda: kerasnorm.GroupNorm(2), "computes its statistics over the time axis"),
    (lambda: L.LayerNormalization(axis=1), r"normalizes over the time axis"),
    (lambda: L.Flatten(), "is not a layer known to act on each time step"),
    (
        lambda: L.LSTM(4, return_state=True),
        r"returns its states \(return_state=True\)",
    ),
]


@pytest.mark.parametrize("make, reason", REFUSED)
def test_layers_that_mix_time_steps_are_refused(make, reason, tmp_path):
    layer = make()
    inputs = keras.Input((STEPS, FEATURES))
    out = layer(L.Dense(4)(inputs))
    if isinstance(out, list):  # return_state
        out = out[0]
    model = keras.Model(inputs, out)
    pattern = rf"layer '{layer.name}' \({type(layer).__name__}\).* it {reason}"
    with pytest.raises(ExportConversionError, match=pattern):
        to_tflite(model, tmp_path / "step.tflite", streaming=True)
    with pytest.raises(ExportConversionError, match=pattern):
        to_saved_model(model, tmp_path / "served", streaming=True)
    assert os.listdir(tmp_path) == []


def test_attention_is_refused(tmp_path):
    inputs = keras.Input((STEPS, FEATURES))
    attention = L.MultiHeadAttention(2, 2, name="attend")
    model = keras.Model(inputs, attention(inputs, inputs))
    with pytest.raises(ExportConversionError, match=r"'attend'.* attends over"):
        to_tflite(model, tmp_path / "step.tflite", streaming=True)


def test_per_step_convolution_and_time_distributed_are_accepted(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((STEPS, FEATURES)),
            L.Conv1D(4, 1),
            L.TimeDistributed(L.Dense(3)),
            kerasnorm.LayerNormSimpleRNN(3, return_sequences=True),
        ]
    )
    path = tmp_path / "s.tflite"
    to_tflite(model, path, streaming=True)
    # Run step by step here, against the sequence model on the same frames.
    x = np.random.default_rng(3).standard_normal((1, STEPS, FEATURES), "float32")
    _, (got,) = _steps(path, x)
    want = np.asarray(model(x, training=False))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


def test_argument_errors(tmp_path):
    model = keras.Sequential([keras.Input((STEPS, FEATURES)), L.LSTM(3)])
    with pytest.raises(ValueError, match="representative_data=None"):
        to_tflite(model, tmp_path / "s.tflite", streaming=True, quantize="int8")
    with pytest.raises(ValueError, match=r"end in '.tflite'"):
        to_tflite(model, tmp_path / "s.tfl", streaming=True)
    flat = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    with pytest.raises(ValueError, match=r"\(batch, time, features\)"):
        to_tflite(flat, tmp_path / "s.tflite", streaming=True)


def test_cli_streaming(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((STEPS, FEATURES)),
            kerasnorm.LayerNormGRU(4, name="gru"),
            L.Dense(2),
        ]
    )
    model.save(tmp_path / "kws.keras")
    np.save(tmp_path / "calib.npy", _sequences(32))
    out = tmp_path / "out"
    argv = ["export", str(tmp_path / "kws.keras"), "--out", str(out), "--streaming"]
    code = main([*argv, "--saved-model", "--tflite"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert sorted(os.listdir(out)) == ["kws", "kws.tflite"]
    runner = litert.StreamingRunner((out / "kws.tflite").read_bytes())
    assert runner.state_names == ("state_gru_0",)
    fn = tf.saved_model.load(str(out / "kws" / "1")).signatures["serving_default"]
    assert sorted(fn.structured_input_signature[1]) == ["state_gru_0", "x"]

    conv = keras.Sequential([keras.Input((STEPS, FEATURES)), L.Conv1D(2, 3)])
    conv.save(tmp_path / "conv.keras")
    argv = ["export", str(tmp_path / "conv.keras"), "--out", str(out), "--streaming"]
    assert main([*argv, "--tflite"]) == EXIT_CONVERSION
    assert "convolves over time" in capsys.readouterr().err


def test_functional_graph_with_residual_batchnorm_and_nested_model(tmp_path):
    """Merges, a nested Sequential and a BatchNorm folded into its Dense."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((STEPS, FEATURES))
    h = L.BatchNormalization(name="bn")(L.Dense(6, name="proj")(inputs))
    inner = keras.Sequential(
        [keras.Input((STEPS, 6)), kerasnorm.LayerNormLSTM(6, return_sequences=True)]
    )
    h = L.Add()([h, inner(h)])
    outputs = L.Dense(2)(L.Concatenate()([h, L.ReLU()(h)]))
    model = keras.Model(inputs, outputs)
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.full(6, 0.3, "float32"))
    bn.moving_variance.assign(np.full(6, 2.0, "float32"))
    path = tmp_path / "graph.tflite"
    result = to_tflite(model, path, streaming=True)
    assert [f.batchnorm for f in result.fold_report.folded] == ["bn"]
    x = _sequences(1, seed=8)
    _, (outputs,) = _steps(path, x)
    want = model(x).numpy()
    np.testing.assert_allclose(outputs, want, atol=1e-5 * np.abs(want).max())
