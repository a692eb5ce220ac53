"""The export pipeline's contracts, each on a model written the way Keras'
guides write one: unnamed Inputs, Sequential, dict inputs, mixed precision,
streaming; each test's comment says what goes wrong without the
behaviour it pins."""

import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm.export import litert
from kerasnorm.export import model_inputs
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.inputs.data import RANDOM_SAMPLES
from kerasnorm.export.litert.runner import interpreter as litert_interpreter
from tests.support.helpers import random_inputs

pytestmark = pytest.mark.tf_only

L = keras.layers


def _under(policy, build):
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        return build()
    finally:
        keras.config.set_dtype_policy(saved)


def _unnamed():
    x = keras.Input((4,))  # no name: Keras generates the tensor's
    y = L.Dense(2)(L.BatchNormalization()(L.Dense(6)(x)))
    return keras.Model(x, y)


def _sequential():
    return keras.Sequential(
        [keras.Input((4,)), L.Dense(6), L.BatchNormalization(), L.Dense(2)]
    )


@pytest.mark.parametrize("build", [_unnamed, _sequential])
def test_half_precision_model_with_unnamed_inputs_exports(build, tmp_path):
    # The check against the original feeds the copy's SavedModel by
    # signature name, not by the original's generated tensor name.
    model = _under("mixed_float16", build)
    x = random_inputs((5, 4))
    result = to_saved_model(model, tmp_path / "sm", verify_inputs=x)
    assert result.rebuilt_from == "mixed_float16"
    assert result.original_verification.samples == 5
    assert result.fold_report.check_shapes == [(5, 4)]
    fn = tf.saved_model.load(result.path).signatures["serving_default"]
    assert list(fn.structured_input_signature[1]) == ["input_0"]
    # The SavedModel computes the original within its half-precision bound.
    (y,) = fn(input_0=tf.constant(x)).values()
    want = np.asarray(model(x), "float32")
    error = np.max(np.abs(y.numpy() - want)) / np.max(np.abs(want))
    assert error <= result.original_verification.tolerance


def _tokens_model():
    """A keras-hub-style backbone in miniature: a dict of integer inputs."""
    keras.utils.set_random_seed(1)
    token_ids = keras.Input((6,), dtype="int32", name="token_ids")
    padding_mask = keras.Input((6,), dtype="int32", name="padding_mask")
    x = L.Embedding(20, 4)(token_ids)
    mask = L.Reshape((6, 1))(keras.ops.cast(padding_mask, "float32"))
    x = L.BatchNormalization()(L.Dense(5)(x * mask))
    return keras.Model(
        {"token_ids": token_ids, "padding_mask": padding_mask},
        L.Dense(3, name="head")(x),
    )


def _tokens(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(0, 20, (n, 6)).astype("int32"),
        "padding_mask": (rng.random((n, 6)) < 0.8).astype("int32"),
    }


@pytest.mark.parametrize("export_fn", [to_saved_model, to_tflite])
@pytest.mark.parametrize("given", [True, False])
def test_dict_input_model_exports_in_its_own_structure(export_fn, given, tmp_path):
    # The parity check passes the model its dict, not a list ("The
    # structure of `inputs` doesn't match"); the .tflite runner leaves
    # integer token ids unquantized (their scale is 0).
    model = _tokens_model()
    data = _tokens(4)
    path = tmp_path / ("m" if export_fn is to_saved_model else "m.tflite")
    result = export_fn(model, path, verify_inputs=data if given else None)
    assert result.verification.samples == (4 if given else RANDOM_SAMPLES)
    assert result.fold_report.folded and result.fold_report.check_shapes == (
        [(4, 6), (4, 6)] if given else [(RANDOM_SAMPLES, 6)] * 2
    )
    if export_fn is to_tflite:
        runner = litert.Runner(path.read_bytes(), model)
        assert runner.input_names == ("padding_mask", "token_ids")
        got = runner.predict(data)[0]
        want = np.asarray(model(data))
        assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def _two_inputs():
    age, city = keras.Input((3,), name="age"), keras.Input((2,), name="city")
    y = L.Dense(2, name="score")(L.Concatenate()([age, city]))
    return keras.Model({"age": age, "city": city}, y)


def test_both_artifacts_carry_the_same_names(tmp_path):
    # Both formats name the signature `age, city -> score`.
    model = _two_inputs()
    data = {"age": random_inputs((4, 3)), "city": random_inputs((4, 2), seed=1)}
    saved = to_saved_model(model, tmp_path / "sm", verify_inputs=data)
    lite = to_tflite(model, tmp_path / "m.tflite", verify_inputs=data)
    fn = tf.saved_model.load(saved.path).signatures["serving_default"]
    tflite = litert_interpreter(open(lite.path, "rb").read()).get_signature_list()
    assert sorted(fn.structured_input_signature[1]) == ["age", "city"]
    assert list(fn.structured_outputs) == ["score"]
    assert tflite == {
        "serving_default": {"inputs": ["age", "city"], "outputs": ["score"]}
    }
    assert litert.signature_names(model) == (["age", "city"], ["score"])


def test_signature_name_rule():
    # Generated Input names give way to positions; output layers keep theirs;
    # names that coincide are numbered.
    a, b = keras.Input((2,)), keras.Input((2,), name="image-rgb")
    model = keras.Model([a, b], [L.Dense(1, name="p")(a), L.Dense(1, name="q")(b)])
    assert litert.signature_names(model) == (["input_0", "image_rgb"], ["p", "q"])
    x = keras.Input((2,), name="x")
    shared = L.Dense(1, name="same")
    twice = keras.Model(x, [shared(x), shared(x)])
    assert litert.signature_names(twice) == (["x"], ["output_0", "output_1"])


def _sequence_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((None, 6)),
            L.Dense(8),
            L.BatchNormalization(),
            L.LSTM(4, return_sequences=True),
        ]
    )


@pytest.mark.parametrize("export_fn", [to_saved_model, to_tflite])
def test_streaming_checks_run_on_the_given_inputs(export_fn, tmp_path):
    # The fold's self-check runs on the given sequences, not invented ones.
    sequences = random_inputs((5, 9, 6))
    path = tmp_path / ("m" if export_fn is to_saved_model else "m.tflite")
    result = export_fn(_sequence_model(), path, streaming=True, verify_inputs=sequences)
    assert result.fold_report.check_shapes == [(5, 9, 6)]
    assert result.verification.samples == 5


@pytest.mark.parametrize("export_fn", [to_saved_model, to_tflite])
def test_streaming_half_precision_is_checked_against_the_original(export_fn, tmp_path):
    # A rebuilt streaming model is checked against the original too.
    model = _under("mixed_float16", _sequence_model)
    sequences = random_inputs((4, 7, 6))
    path = tmp_path / ("m" if export_fn is to_saved_model else "m.tflite")
    result = export_fn(model, path, streaming=True, verify_inputs=sequences)
    assert result.rebuilt_from == "mixed_float16"
    check = result.original_verification
    assert check.passed and check.samples == 4
    assert check.tolerance > result.verification.tolerance


def test_max_unroll_steps_is_refused_with_streaming(tmp_path):
    # Refused, not ignored: a streaming step unrolls nothing.
    with pytest.raises(ValueError, match=r"max_unroll_steps=3 with streaming=True"):
        to_tflite(
            _sequence_model(), tmp_path / "m.tflite", streaming=True, max_unroll_steps=3
        )
    with pytest.raises(ValueError, match=r"`max_unroll_steps` must be a positive"):
        to_tflite(_unnamed(), tmp_path / "m.tflite", max_unroll_steps=-5)
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive"):
        to_tflite(_unnamed(), tmp_path / "m.tflite", batch_size=0)
    assert os.listdir(tmp_path) == []


def test_model_inputs_converts_to_the_model_structure(tmp_path):
    model = _tokens_model()
    data = _tokens(3)
    as_list = [data["padding_mask"], data["token_ids"]]  # model.inputs order
    np.savez(tmp_path / "d.npz", **data)
    with np.load(tmp_path / "d.npz") as archive:
        from_archive = model_inputs(model, archive)
    for given in (data, as_list, from_archive):
        converted = model_inputs(model, given)
        assert sorted(converted) == ["padding_mask", "token_ids"]
        np.testing.assert_array_equal(converted["token_ids"], data["token_ids"])
    single = model_inputs(_unnamed(), random_inputs((2, 4)).astype("float64"))
    assert single.dtype == np.float32 and single.shape == (2, 4)
    with pytest.raises(ValueError, match=r"verify_inputs is missing model input"):
        model_inputs(model, {"token_ids": data["token_ids"]}, argument="verify_inputs")
    with pytest.raises(ValueError, match=r"data for input 'token_ids' should have"):
        model_inputs(model, {**data, "token_ids": data["token_ids"][:, :2]})


def test_existing_file_refusal_names_the_python_argument(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(b"")
    with pytest.raises(FileExistsError, match="overwrite=True") as err:
        to_tflite(_unnamed(), path)
    assert "--" not in str(err.value)


def test_the_model_is_checked_once_per_export(tmp_path, monkeypatch):
    # One check per export, however many stages read the model.
    calls = []
    from kerasnorm.export.model import facts as model_module

    check = model_module.check_model

    def counted(*args, **kwargs):
        calls.append(args[0])
        return check(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("kerasnorm.export") and hasattr(module, "check_model"):
            monkeypatch.setattr(module, "check_model", counted)
    to_tflite(_unnamed(), tmp_path / "m.tflite")
    assert len(calls) == 1
    calls.clear()
    to_saved_model(_unnamed(), tmp_path / "sm")
    assert len(calls) == 1
    calls.clear()
    to_tflite(_sequence_model(), tmp_path / "step.tflite", streaming=True)
    assert len(calls) == 1
