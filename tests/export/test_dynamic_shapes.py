"""Dynamic dimensions: what the model leaves undefined
stays dynamic in the artifact, `batch_size` / `input_signature` fix it, and
a dynamic artifact is checked at two shapes of each dynamic dimension.

The references are independent of the exporters: the nine-line model's
function written in numpy from its weights (two pointwise convolutions and
the residual), the Keras model for the recurrent ones (at shapes the export
never saw). The files are read back with the LiteRT interpreter and their
`shape_signature` compared with what the rule says.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasnorm
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify

# SavedModel and TFLite: TensorFlow programs.
pytestmark = pytest.mark.tf_only

FEATURES = 32
FRAMES = 12  # the speech model's verification length
MODES = [None, "float16", "dynamic", "int8", "int16x8"]


def nine_lines():
    """Nine lines from a user report: a one-channel series, two pointwise
    convolutions and the residual (`+ i`), which Keras' TensorFlow `add`
    wrote as an NCHW bias-add when traced at batch 1."""
    keras.utils.set_random_seed(0)
    i = keras.Input((32, 1))
    x = keras.layers.Conv1D(4, 1, activation="relu")(i)
    return keras.Model(i, keras.layers.Conv1D(1, 1)(x) + i)


def nine_lines_numpy(model, x):
    (w1, b1), (w2, b2) = [layer.get_weights() for layer in model.layers[1:3]]
    hidden = np.maximum(x @ w1[0] + b1, 0.0)
    return hidden @ w2[0] + b2 + x


def series(n, seed=0, length=32):
    return np.random.default_rng(seed).standard_normal((n, length, 1)).astype("float32")


def speech():
    """`keras.Input((None, 32))`, the usual CTC layout: a layer-normalized
    GRU over frames of any length, per-frame logits."""
    keras.utils.set_random_seed(1)
    i = keras.Input((None, FEATURES), name="input")
    x = kerasnorm.LayerNormGRU(16, return_sequences=True)(i)
    x = kerasnorm.LayerNorm()(x)
    return keras.Model(i, keras.layers.Dense(10, name="logits")(x))


def frames(n, length=FRAMES, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, length, FEATURES)).astype("float32")


def shape_signature(content):
    """The file's input shapes by signature name, None where dynamic."""
    runner = litert.Runner(content)
    return runner.input_shapes


def rel_error(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def rms_error(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


# --- the nine lines: every mode, dynamic batch and batch 1 ------------------


@pytest.mark.parametrize("batch_size", [None, 1])
@pytest.mark.parametrize("quantize", MODES)
def test_nine_lines_export_in_every_mode(quantize, batch_size, tmp_path):
    """Before: every TFLite mode failed ("'tf.Transpose' op x should be of
    the same rank with y"). Now the default file has a dynamic batch and
    batch 1 is traced at a dynamic batch inside the fixed signature."""
    model = nine_lines()
    path = tmp_path / "nine.tflite"
    result = to_tflite(
        model,
        path,
        quantize=quantize,
        batch_size=batch_size,
        representative_data=series(64, seed=1),
        verify_inputs=series(16, seed=2),
    )
    assert result.verification.passed
    content = path.read_bytes()
    # The calibrated modes keep batch 1 unless batch_size says otherwise.
    batch = 1 if quantize in ("int8", "int16x8") else batch_size
    assert list(shape_signature(content).values()) == [(batch, 32, 1)]
    # A dynamic batch is checked at two sizes, a fixed one at its own.
    batches = [call[0][0] for call in result.verification.shapes]
    assert batches == ([16, 1] if batch is None else [1])

    x = series(3 if batch is None else 1, seed=3)
    (got,) = litert.Runner(content).predict(x)
    want = nine_lines_numpy(model, x)
    if quantize in (None, "float16"):
        assert rel_error(got, want) < (1e-5 if quantize is None else 2e-3)
    else:
        assert rms_error(got, want) < 0.1


def test_nine_lines_saved_model_batch_one(tmp_path):
    model = nine_lines()
    result = to_saved_model(model, tmp_path / "m", batch_size=1)
    function = tf.saved_model.load(result.path).signatures["serving_default"]
    (spec,) = function.structured_input_signature[1].values()
    assert tuple(spec.shape.as_list()) == (1, 32, 1)
    x = series(1, seed=4)
    (y,) = function(tf.constant(x)).values()
    assert rel_error(np.asarray(y), nine_lines_numpy(model, x)) < 1e-5


# --- a speech model, keras.Input((None, 32)) --------------------------------


@pytest.mark.parametrize("quantize", [None, "float16", "dynamic"])
def test_speech_model_keeps_its_length_dynamic(quantize, tmp_path):
    """Before: refused in every mode. Now: the length stays dynamic; a
    recurrent model's TFLite batch is fixed (1), since the converter lowers
    a rolled loop only for a known batch. Checked at two lengths, and at a
    third one against Keras."""
    model = speech()
    path = tmp_path / "speech.tflite"
    result = to_tflite(model, path, quantize=quantize, verify_inputs=frames(6))
    assert result.verification.passed
    assert [call[0][1] for call in result.verification.shapes] == [FRAMES, FRAMES // 2]
    content = path.read_bytes()
    assert shape_signature(content) == {"input": (1, None, FEATURES)}
    x = frames(1, length=17, seed=7)
    (got,) = litert.Runner(content)(x)
    want = np.asarray(model(x))
    error = rel_error if quantize is None else rms_error
    assert error(got, want) < (1e-4 if quantize is None else 0.05)


@pytest.mark.parametrize("quantize", ["int8", "int16x8"])
def test_speech_full_integer_refusal_names_the_input_and_works(quantize, tmp_path):
    """The full-integer modes unroll the GRU: the refusal names the input as
    the user did, the dimension, why, and alternatives that both work."""
    model = speech()
    data = frames(48, seed=2)
    with pytest.raises(ValueError) as refusal:
        to_tflite(
            model, tmp_path / "a.tflite", quantize=quantize, representative_data=data
        )
    message = str(refusal.value)
    assert "undefined time dimension" in message
    assert "input_signature={'input': (None, T, 32)}" in message
    assert 'quantize="dynamic"' in message and "input_0" not in message
    assert list(tmp_path.iterdir()) == []

    # The first alternative: the length fixed by input_signature.
    path = tmp_path / "fixed.tflite"
    result = to_tflite(
        model,
        path,
        quantize=quantize,
        representative_data=data,
        input_signature={"input": (None, FRAMES, FEATURES)},
    )
    assert result.verification.passed and result.unrolled
    assert shape_signature(path.read_bytes()) == {"input": (1, FRAMES, FEATURES)}
    # The second one ("dynamic") is test_speech_model_keeps_its_length_dynamic.


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_speech_model_streams_with_a_dynamic_batch(quantize, tmp_path):
    """A streaming step takes one frame: the length never mattered, and its
    batch (streams side by side) stays dynamic (fixed by batch_size=None
    at int8: the calibrated modes keep batch 1 unless told otherwise, so
    the int8 step is asked for no batch and keeps 1)."""
    model = speech()
    path = tmp_path / "step.tflite"
    result = to_tflite(
        model,
        path,
        quantize=quantize,
        streaming=True,
        representative_data=frames(32, seed=3),
        verify_inputs=frames(5),
    )
    assert result.verification.passed
    dynamic = quantize is None
    shapes = [call[0][0] for call in result.verification.shapes]
    assert shapes == ([5, 1] if dynamic else [1])
    runner = litert.StreamingRunner(path.read_bytes())
    assert runner.batch_size == (None if dynamic else 1)
    x = frames(2 if dynamic else 1, length=9, seed=8)
    (got,) = runner.run(x)
    error = rel_error if quantize is None else rms_error
    assert error(got, np.asarray(model(x))) < (1e-4 if quantize is None else 0.1)


def test_speech_saved_model_is_dynamic(tmp_path):
    model = speech()
    result = to_saved_model(model, tmp_path / "m", verify_inputs=frames(4))
    assert [call[0] for call in result.verification.shapes] == [
        (4, FRAMES, FEATURES),
        (1, FRAMES // 2, FEATURES),
    ]
    function = tf.saved_model.load(result.path).signatures["serving_default"]
    (spec,) = function.structured_input_signature[1].values()
    assert tuple(spec.shape.as_list()) == (None, None, FEATURES)
    x = frames(3, length=21, seed=9)
    (y,) = function(input=tf.constant(x)).values()
    assert rel_error(np.asarray(y), np.asarray(model(x))) < 1e-4


# --- input_signature: Keras' forms and the refusals -------------------------


def tokens_model():
    """Token ids of any length (no recurrent layer): the batch and the
    length both stay dynamic by default."""
    keras.utils.set_random_seed(2)
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(50, 8)(tokens)
    x = kerasnorm.LayerNorm()(x)
    return keras.Model(tokens, keras.layers.Dense(3, name="scores")(x))


def token_ids(n, length=10, seed=0):
    return np.random.default_rng(seed).integers(0, 50, (n, length)).astype("int32")


SIGNATURES = {
    "default": (None, (None, None)),
    "keras_list": ([keras.InputSpec(shape=(None, 10), dtype="int32")], (None, 10)),
    "tensor_spec": (tf.TensorSpec((None, 10), tf.int32), (None, 10)),
    "dict": ({"tokens": (2, 10)}, (2, 10)),
    "tuple": ((None, 10), (None, 10)),
}


@pytest.mark.parametrize("form", sorted(SIGNATURES))
def test_input_signature_forms(form, tmp_path):
    signature, expected = SIGNATURES[form]
    model = tokens_model()
    path = tmp_path / "tokens.tflite"
    result = to_tflite(
        model, path, input_signature=signature, verify_inputs=token_ids(4)
    )
    assert result.verification.passed
    content = path.read_bytes()
    assert shape_signature(content) == {"tokens": expected}
    x = token_ids(expected[0] or 3, length=expected[1] or 7, seed=4)
    (got,) = litert.Runner(content).predict(x)
    assert rel_error(got, np.asarray(model(x))) < 1e-5


@pytest.mark.parametrize(
    "signature, match",
    [
        ({"words": (None, 10)}, r"names \['words'\].*inputs are \['tokens'\]"),
        ((None, 10, 1), r"rank 3.*rank 2"),
        ([keras.InputSpec(shape=(None, 10), dtype="float32")], "dtype float32"),
        ((3, 10), "batch 3 and batch_size=2"),
        ((None, 0), "sizes are positive"),
    ],
)
def test_input_signature_refusals(signature, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        to_tflite(
            tokens_model(),
            tmp_path / "m.tflite",
            input_signature=signature,
            batch_size=2,
        )
    assert list(tmp_path.iterdir()) == []


def test_input_signature_cannot_change_a_defined_dimension(tmp_path):
    with pytest.raises(ValueError, match="defines it as 32"):
        to_tflite(nine_lines(), tmp_path / "m.tflite", input_signature=(None, 16, 1))


def test_verify_inputs_must_fit_a_fixed_dimension(tmp_path):
    with pytest.raises(ValueError, match="fixes its dimension 1 at 10"):
        to_tflite(
            tokens_model(),
            tmp_path / "m.tflite",
            input_signature=(None, 10),
            verify_inputs=token_ids(4, length=12),
        )


def signal_model():
    """Float frames of any length through a convolution and a LayerNorm."""
    keras.utils.set_random_seed(3)
    i = keras.Input((None, 4), name="signal")
    x = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(i)
    x = kerasnorm.LayerNorm()(x)
    return keras.Model(i, keras.layers.Dense(3, name="scores")(x))


def test_calibration_at_another_length_than_the_check(tmp_path):
    """int8 of a dynamic-length file calibrates on sequences of one length
    (6) and is checked at others (the verify_inputs' 16, and 8)."""
    rng = np.random.default_rng(5)
    result = to_tflite(
        signal_model(),
        tmp_path / "m.tflite",
        quantize="int8",
        representative_data=rng.standard_normal((100, 6, 4)).astype("float32"),
        verify_inputs=rng.standard_normal((20, 16, 4)).astype("float32"),
    )
    assert result.verification.passed
    assert [call[0][1] for call in result.verification.shapes] == [16, 8]


# --- Runner and verify on a dynamic file ------------------------------------


def test_runner_resizes_and_refuses_a_fixed_dimension(tmp_path):
    model = tokens_model()
    path = tmp_path / "m.tflite"
    to_tflite(model, path, input_signature=(None, 10))
    runner = litert.Runner(path.read_bytes(), model)
    assert runner.batch_size is None
    for n in (1, 5, 40):  # 40 is more than one predict call
        x = token_ids(n, seed=n)
        (got,) = runner.predict(x)
        assert got.shape == (n, 10, 3)
        assert rel_error(got, np.asarray(model(x))) < 1e-5
    with pytest.raises(ValueError, match=r"'tokens'.*\(None, 10\).*\(2, 11\)"):
        runner(token_ids(2, length=11))


def test_verify_runs_a_dynamic_file_at_two_shapes(tmp_path):
    model = tokens_model()
    path = tmp_path / "m.tflite"
    to_tflite(model, path)
    check = verify(model, path, token_ids(6, length=9, seed=1))
    assert check.passed
    assert check.shapes == (((6, 9),), ((1, 4),))
    assert "at shapes (6, 9) and (1, 4)" in str(check)


def tiny_encoder():
    keras.utils.set_random_seed(0)
    layers = keras.layers
    i = keras.Input((None, 16), name="tokens")
    h = kerasnorm.LayerNorm()(i)
    x = i + layers.MultiHeadAttention(2, 8)(h, h)
    h = kerasnorm.LayerNorm()(x)
    x = x + layers.Dense(16)(layers.Dense(32, activation="gelu")(h))
    return keras.Model(i, layers.Dense(4, name="logits")(x))


def test_runner_is_right_after_growing_the_length_of_an_int8_file(tmp_path):
    """LiteRT's XNNPACK computes the first call after resizing an allocated
    fast int8 file to a longer sequence wrong (rms 0.37 at batch 4 from
    (1, 4), 0.02 right):
    `Runner` runs each new shape on an interpreter allocated at it."""
    model = tiny_encoder()
    rng = np.random.default_rng(1)
    path = tmp_path / "encoder.tflite"
    to_tflite(
        model,
        path,
        quantize="int8",
        representative_data=rng.standard_normal((64, 16, 16)).astype("float32"),
    )
    runner = litert.Runner(path.read_bytes())
    assert runner.input_shapes == {"tokens": (1, None, 16)}  # int8: batch 1
    x = rng.standard_normal((1, 32, 16)).astype("float32")
    for inputs in (x[:, :4], x, x[:, :8], x):
        (got,) = runner(inputs)
        assert rms_error(got, np.asarray(model(inputs))) < 0.1


def test_runner_allocates_once_per_shape(tmp_path):
    """A call at the shapes of an earlier one reuses its interpreter
    (LiteRT's signature runner re-plans a dynamic file on every call); a
    new shape allocates one, and is right."""
    model = tokens_model()
    path = tmp_path / "m.tflite"
    to_tflite(model, path)
    runner = litert.Runner(path.read_bytes())
    x, y = token_ids(2, length=6, seed=1), token_ids(3, length=9, seed=2)
    for inputs, allocations in ((x, 1), (x, 1), (y, 2), (x, 2), (y, 2)):
        (got,) = runner(inputs)
        assert runner.allocations == allocations
        assert rel_error(got, np.asarray(model(inputs))) < 1e-5


def test_a_dataset_of_batches_of_different_lengths_is_refused_clearly(tmp_path):
    lengths = tf.data.Dataset.from_generator(
        lambda: (token_ids(2, length=n) for n in (5, 7)),
        output_signature=tf.TensorSpec((None, None), tf.int32),
    )
    with pytest.raises(ValueError, match=r"'tokens' of different shapes.*pad"):
        to_tflite(tokens_model(), tmp_path / "m.tflite", verify_inputs=lengths)
