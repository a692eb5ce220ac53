"""What an export's check ran on: without data, 32 invented
inputs shaped like the model's (integers its embeddings accept, sequences
for a sequence model), and `Verification.checked_on` says so, with a hint to
pass `verify_inputs=` (`inputs.data.inputs_to_check`)."""

import keras
import pytest

from kerasnorm.export import VERIFY_SAMPLES
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify
from kerasnorm.export.inputs.data import RANDOM_SAMPLES
from kerasnorm.export.streaming.plan import DEFAULT_STEPS
from tests.export.test_inputs import POSITIONS
from tests.export.test_inputs import _text_model
from tests.support.helpers import random_inputs

pytestmark = pytest.mark.tf_only

L = keras.layers
HINT = "pass verify_inputs="


def _dense():
    keras.utils.set_random_seed(0)
    x = keras.Input((4,), name="x")
    return keras.Model(x, L.Dense(2, name="y")(L.BatchNormalization()(L.Dense(6)(x))))


def test_no_data_checks_on_random_inputs_and_says_so(tmp_path):
    model = _dense()
    result = to_saved_model(model, tmp_path / "sm")
    check = result.verification
    assert RANDOM_SAMPLES == 32
    assert check.checked_on == "random" and check.random_inputs
    assert check.samples == RANDOM_SAMPLES
    assert result.fold_report.check_shapes == [(RANDOM_SAMPLES, 4)]
    text = str(check)
    assert f"{RANDOM_SAMPLES} samples (random inputs)" in text
    assert text.endswith(
        "Checked on random inputs, which say little about real data: pass "
        "verify_inputs= (held-out inputs) for a check that does."
    )
    # `verify` on the artifact, without inputs, is the same check.
    again = verify(model, result.path)
    assert again.random_inputs and again.samples == RANDOM_SAMPLES
    assert not verify(model, result.path, random_inputs((3, 4))).random_inputs


def test_given_inputs_are_named_and_carry_no_hint(tmp_path):
    model = _dense()
    data = random_inputs((5, 4))
    check = to_saved_model(model, tmp_path / "sm", verify_inputs=data).verification
    assert check.checked_on == "verify_inputs" and not check.random_inputs
    assert check.samples == 5
    assert "5 samples (of verify_inputs)" in str(check) and HINT not in str(check)
    # Without verify_inputs, to_tflite checks on the calibration data.
    calibration = random_inputs((VERIFY_SAMPLES + 10, 4), seed=1)
    check = to_tflite(
        model, tmp_path / "m.tflite", quantize="int8", representative_data=calibration
    ).verification
    assert check.checked_on == "representative_data"
    assert check.samples == VERIFY_SAMPLES and HINT not in str(check)


def test_a_refusal_on_random_inputs_says_what_it_ran_on(tmp_path):
    with pytest.raises(ExportVerificationError) as caught:
        to_tflite(_dense(), tmp_path / "m.tflite", quantize="dynamic", tolerance=1e-9)
    message = str(caught.value)
    assert f"{RANDOM_SAMPLES} samples (random inputs)" in message and HINT in message


def test_random_inputs_are_shaped_like_the_models(tmp_path):
    # A text model: integer tokens below its vocabulary, its undefined length
    # at the first size its 16-position table holds (32 fails). A sequence
    # model streamed: random sequences of DEFAULT_STEPS steps.
    text = to_saved_model(_text_model(), tmp_path / "text")
    assert text.verification.random_inputs
    assert text.fold_report.check_shapes == [(RANDOM_SAMPLES, POSITIONS)]
    assert text.verification.samples == RANDOM_SAMPLES

    keras.utils.set_random_seed(0)
    frames = keras.Input((None, 3), name="frames")
    x = L.BatchNormalization()(L.Dense(4)(frames))
    model = keras.Model(frames, L.LSTM(2, return_sequences=True, name="y")(x))
    step = to_tflite(model, tmp_path / "step.tflite", streaming=True)
    assert step.verification.random_inputs
    assert step.fold_report.check_shapes == [(RANDOM_SAMPLES, DEFAULT_STEPS, 3)]
