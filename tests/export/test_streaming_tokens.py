"""Streaming token models: `(batch, time)` ids into an `Embedding`, one id
per call (`to_tflite(..., streaming=True)`).

References, independent of the step: the Keras sequence model on every
prefix of the sequence (what the step outputs at step t), and for a mask
the identity of masking itself: a stream with padding ids inserted gives,
at the real ids, what the stream without them gives. The float files are
compared within 1e-5 of the output scale (float32 rounding over a few
steps, as in test_export_streaming.py); the int8 files within the rms
tolerance of the int8 check, 0.1 of the output scale.
"""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import ExportConversionError
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

L = keras.layers
STEPS, VOCAB, BATCH = 10, 40, 2
KINDS = {"gru": kerasnorm.LayerNormGRU, "lstm": kerasnorm.LayerNormLSTM}


def _tokens(n, seed=0, pad=True):
    """Ids in [1, VOCAB) with, when `pad`, padded tails of varying length
    and a padding id inside some sequences (a mask must handle both)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, STEPS)).astype("int32")
    if pad:
        for k in range(0, n, 2):
            ids[k, STEPS - 1 - k % 5 :] = 0
        ids[1::4, 3] = 0
    return ids


def _model(kind="gru", mask_zero=True, return_sequences=True, seed=0, layers=2):
    """Ids -> Embedding -> a recurrent layer [-> Dense -> a second one] ->
    Dense: with two, the mask reaches the second layer through the first
    and the Dense between them."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None,), dtype="int32", name="tokens")
    x = L.Embedding(VOCAB, 8, mask_zero=mask_zero, name="embed")(inputs)
    if layers == 2:
        x = KINDS[kind](8, return_sequences=True, name="rec1")(x)
        x = L.Dense(8, activation="tanh")(x)
    x = KINDS[kind](16, return_sequences=return_sequences, name="rec2")(x)
    return keras.Model(inputs, L.Dense(3, name="head")(x))


def _stream(content, ids):
    """The step file run over `ids` `(n, time)`, `BATCH` streams at a time
    from zero states: `(n, time, ...)`."""
    runner = litert.StreamingRunner(content)
    assert runner.batch_size == BATCH
    chunks = []
    for i in range(0, len(ids), BATCH):
        runner.reset()
        chunks.append(runner.run(ids[i : i + BATCH])[0])
    return np.concatenate(chunks)


def _frame_detail(content):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=content).get_signature_runner()
    return runner.get_input_details()["x"]


def _on_every_prefix(model, ids):
    """At each step t, the model's output for the sequence ending at t (its
    last step's, for a model that returns sequences)."""
    outputs = []
    for t in range(ids.shape[1]):
        y = np.asarray(model(ids[:, : t + 1]))
        outputs.append(y[:, -1] if y.ndim == 3 else y)
    return np.stack(outputs, axis=1)


def _rms_rel(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


MATRIX = [
    pytest.param(
        kind,
        quantize,
        mask_zero,
        return_sequences,
        marks=[pytest.mark.slow] if (kind, quantize) != ("gru", None) else [],
        id=f"{kind}-{quantize}-mask{int(mask_zero)}-seq{int(return_sequences)}",
    )
    for kind in ("gru", "lstm")
    for quantize in (None, "int8")
    for mask_zero in (False, True)
    for return_sequences in (True, False)
]


@pytest.mark.parametrize("kind, quantize, mask_zero, return_sequences", MATRIX)
def test_token_step_is_the_model_on_every_prefix(
    kind, quantize, mask_zero, return_sequences, tmp_path
):
    # int8 on one recurrent layer: a random-weight two-LSTM stack's int8
    # step is 0.08-0.19 rms of its outputs with or without tokens and mask
    # (the calibration count moves it), an int8 matter of its own.
    layers = 2 if quantize is None else 1
    model = _model(kind, mask_zero, return_sequences, layers=layers)
    path = tmp_path / "step.tflite"
    to_tflite(
        model,
        path,
        streaming=True,
        quantize=quantize,
        batch_size=BATCH,
        representative_data=_tokens(64, seed=1),
        verify_inputs=_tokens(16, seed=2),
        calibration_samples=None if quantize is None else 600,
    )
    content = path.read_bytes()
    frame = _frame_detail(content)
    # One token id per stream per call, integer as the model takes it.
    assert tuple(frame["shape"]) == (BATCH,)
    assert np.dtype(frame["dtype"]) == np.int32

    ids = _tokens(6, seed=3)
    got = _stream(content, ids)
    want = _on_every_prefix(model, ids)
    if quantize is None:
        np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())
    else:
        assert _rms_rel(got, want) < 0.1


@pytest.mark.parametrize("return_sequences", [True, False])
def test_padding_ids_leave_the_stream_where_it_was(return_sequences, tmp_path):
    """Masking's identity: with mask_zero, a padding id changes neither the
    states nor the output; the stream with padding inserted is, at the
    real ids, the stream without it (and at a padding id, the output of
    the id before)."""
    model = _model("gru", mask_zero=True, return_sequences=return_sequences)
    path = tmp_path / "step.tflite"
    to_tflite(model, path, streaming=True, batch_size=BATCH)
    ids = _tokens(BATCH, seed=4, pad=False)[:, :6]
    padded = np.zeros((BATCH, STEPS), "int32")
    real = [0, 2, 3, 6, 7, 9]  # padding at 1, 4, 5 and 8
    padded[:, real] = ids
    content = path.read_bytes()
    clean, stuffed = _stream(content, ids), _stream(content, padded)
    np.testing.assert_allclose(stuffed[:, real], clean, atol=1e-6)
    np.testing.assert_allclose(stuffed[:, [4, 5]], stuffed[:, [3, 3]], atol=1e-6)


def test_masking_layer_on_frames_is_followed(tmp_path):
    """`Masking` on float frames: its mask (an `any` over the features) is
    followed through the step as `Embedding(mask_zero=True)`'s is."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 4))
    x = L.Masking()(inputs)
    x = kerasnorm.LayerNormLSTM(6, return_sequences=True)(x)
    model = keras.Model(inputs, L.Dense(2)(x))
    x = np.random.default_rng(5).standard_normal((BATCH, STEPS, 4)).astype("float32")
    x[0, 3:5] = 0.0
    x[1, 7:] = 0.0
    path = tmp_path / "step.tflite"
    to_tflite(model, path, streaming=True, batch_size=BATCH, verify_inputs=x)
    runner = litert.StreamingRunner(path.read_bytes())
    (got,) = runner.run(x)
    want = _on_every_prefix(model, x)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())
    # A masked frame repeats the output before it.
    np.testing.assert_allclose(got[0, 4], got[0, 2], atol=1e-6)


def test_saved_model_token_step(tmp_path):
    import tensorflow as tf

    model = _model("lstm", mask_zero=True)
    to_saved_model(
        model, tmp_path / "sm", streaming=True, verify_inputs=_tokens(8, seed=6)
    )
    signature = tf.saved_model.load(str(tmp_path / "sm" / "1")).signatures[
        "serving_default"
    ]
    inputs = signature.structured_input_signature[1]
    assert inputs["x"].shape.rank == 1 and inputs["x"].dtype == tf.int32
    ids = _tokens(3, seed=8)
    states = {
        name: tf.zeros((len(ids), *spec.shape[1:]))
        for name, spec in inputs.items()
        if name != "x"
    }
    outputs = []
    for t in range(ids.shape[1]):
        result = signature(x=tf.constant(ids[:, t]), **states)
        states = {name: result[name] for name in states}
        outputs.append(result["output_0"].numpy())
    want = _on_every_prefix(model, ids)
    np.testing.assert_allclose(
        np.stack(outputs, axis=1), want, atol=1e-5 * np.abs(want).max()
    )


def test_int16x8_token_step_converts_and_a_mask_is_refused_by_name(tmp_path):
    plain = tmp_path / "plain.tflite"
    model = _model("gru", mask_zero=False)
    to_tflite(
        model,
        plain,
        streaming=True,
        quantize="int16x8",
        batch_size=BATCH,
        representative_data=_tokens(64, seed=1),
    )
    ids = _tokens(6, seed=3, pad=False)
    assert (
        _rms_rel(_stream(plain.read_bytes(), ids), _on_every_prefix(model, ids)) < 0.05
    )
    masked = tmp_path / "masked.tflite"
    with pytest.raises(ExportConversionError, match=r"'embed' \(Embedding, mask_zero"):
        to_tflite(
            _model("gru", mask_zero=True),
            masked,
            streaming=True,
            quantize="int16x8",
            batch_size=BATCH,
            representative_data=_tokens(64, seed=1),
        )
    assert not masked.exists()


def test_layers_before_the_embedding_that_mix_time_are_refused(tmp_path):
    inputs = keras.Input((STEPS,), dtype="int32", name="tokens")
    # On (batch, time) ids a Reshape moves the time axis.
    x = L.Reshape((STEPS, 1), name="over_time")(inputs)
    x = L.Reshape((STEPS, 4))(L.Embedding(VOCAB, 4)(x))
    model = keras.Model(inputs, kerasnorm.LayerNormGRU(4)(x))
    with pytest.raises(ExportConversionError, match=r"'over_time' \(Reshape\).*time"):
        to_tflite(model, tmp_path / "m.tflite", streaming=True)
    assert not (tmp_path / "m.tflite").exists()


def test_float_input_without_a_time_and_feature_axis_is_refused(tmp_path):
    """A float `(batch, n)` input is no sequence: token ids are integers."""
    model = keras.Sequential([keras.Input((STEPS,)), L.Dense(2)])
    with pytest.raises(ValueError, match=r"integer token ids \(batch, time\)"):
        to_tflite(model, tmp_path / "m.tflite", streaming=True)


def test_an_unknown_keras_op_on_the_sequence_is_refused(tmp_path):
    inputs = keras.Input((STEPS,), dtype="int32")
    x = L.Embedding(VOCAB, 4)(inputs)
    x = keras.ops.flip(x, axis=1)  # reverses time
    model = keras.Model(inputs, kerasnorm.LayerNormGRU(4)(x))
    with pytest.raises(ExportConversionError, match=r"\(Flip\).*keras\.ops call"):
        to_tflite(model, tmp_path / "m.tflite", streaming=True)
