"""What a generative file is checked on, and how a refusal is answered.

- without `verify_inputs`, a model with a tokenizer is checked on
  `prompts.VERIFY_TEXTS` in its own tokenizer (its start token first where
  its preprocessor adds one), teacher-forced over the text's own tokens
  too; one without, on random ids; the result says which;
- GPTQ is fitted to other text (`prompts.CALIBRATION_TEXTS`), so that the
  check judges the rounding on text it was not fitted to; to the user's
  `verify_inputs` where given;
- a step whose file token is a near-tie in the reference (within that
  step's rms logit error, at most the mode's tolerance of its rms logit)
  agrees; a wider gap does not;
- a refused quantized file names every lever (the other modes,
  `verify_inputs` of real text, `min_agreement` at the agreement reached),
  and `min_agreement` at that value writes it; bad values are refused by
  name.
"""

import os

import keras
import numpy as np
import pytest

from kerasnorm.export import to_litert_lm
from kerasnorm.export.litert_lm import check
from kerasnorm.export.litert_lm.prompts import CALIBRATION_TEXTS
from kerasnorm.export.litert_lm.prompts import GIVEN
from kerasnorm.export.litert_lm.prompts import TEXT
from kerasnorm.export.litert_lm.prompts import TEXT_HEAD
from kerasnorm.export.litert_lm.prompts import VERIFY_TEXTS
from kerasnorm.export.litert_lm.prompts import calibration_prompts
from kerasnorm.export.litert_lm.prompts import text_prompts
from kerasnorm.export.numerics.errors import ExportVerificationError
from tests.export import lm_models

pytestmark = pytest.mark.tf_only


def _in_tokenizer(tokenizer, texts, context):
    """Each text in `tokenizer`, cut to leave room in `context` for the
    check's 12 generated tokens."""
    return [np.asarray(tokenizer(t)).tolist()[: context - 1 - 12] for t in texts]


def test_a_model_with_a_tokenizer_is_checked_on_its_own_text(tmp_path):
    pytest.importorskip("keras_hub")
    model = lm_models.keras_hub_lm("qwen3")
    tokenizer = model.preprocessor.tokenizer
    vocabulary = model.backbone.vocabulary_size
    prompts = text_prompts(model, vocabulary, 48)
    assert prompts == _in_tokenizer(tokenizer, VERIFY_TEXTS, 48)
    assert all(len(p) > TEXT_HEAD for p in prompts)
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=48,
        prefill_lengths=(8,),
        quantize="dynamic",
    )
    assert result.check.source == check.TEXT and not result.check.invented_prompts
    # Teacher-forced from the TEXT_HEAD-th token of each text through its 12
    # generated tokens, and the prefill's last row.
    steps = sum(len(p) - TEXT_HEAD + 12 for p in prompts) + 1
    assert result.check.steps == steps


@pytest.mark.parametrize("mode, bits", [("int4", 4), ("weight_only_int8", 8)])
def test_gptq_is_fitted_to_text_the_check_does_not_read(tmp_path, mode, bits):
    """Both int4 and the int8 modes round their products by GPTQ, fitted
    to the held-out texts."""
    pytest.importorskip("keras_hub")
    model = lm_models.keras_hub_lm("qwen3")
    tokenizer = model.preprocessor.tokenizer
    vocabulary = model.backbone.vocabulary_size
    checked = text_prompts(model, vocabulary, 48)
    fit = calibration_prompts(checked, TEXT, model, vocabulary, 48)
    assert fit == _in_tokenizer(tokenizer, CALIBRATION_TEXTS, 48)
    # No sentence of the check's is fitted to.
    assert not {tuple(p) for p in fit} & {tuple(p) for p in checked}
    # The user's prompts are fitted to as they are.
    assert calibration_prompts(checked, GIVEN, model, vocabulary, 48) is checked
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=48,
        prefill_lengths=(8,),
        quantize=mode,
        # Random weights: flat logits the int4 rounding may reorder; the
        # calibration is what this test reads, not the agreement.
        min_agreement=0.01,
    )
    assert result.check.source == check.TEXT
    # Every GPTQ product saw the held-out texts' tokens, a row each per
    # use (a kernel Qwen3 applies twice sees them twice), never the check's.
    rows = sum(len(p) for p in fit)
    seen = {r.rows for r in result.gptq}
    assert result.gptq and rows in seen and all(n % rows == 0 for n in seen)
    assert sum(len(p) for p in checked) % rows != 0
    assert {r.bits for r in result.gptq} == {bits} and all(r.gptq for r in result.gptq)
    assert (len(result.int4_gptq) > 0) == (bits == 4)
    assert result.rounding.startswith(
        f"{len(result.gptq)} of {len(result.gptq)} int{bits} products rounded by GPTQ"
    )


def test_a_start_token_the_preprocessor_adds_comes_first():
    pytest.importorskip("keras_hub")
    model = lm_models.keras_hub_lm("qwen3")
    model.preprocessor.add_start_token = True
    tokenizer = model.preprocessor.tokenizer
    tokenizer.start_token_id = 5
    prompts = text_prompts(model, model.backbone.vocabulary_size, 48)
    assert [p[0] for p in prompts] == [5] * len(VERIFY_TEXTS)
    assert prompts[0][1:] == np.asarray(tokenizer(VERIFY_TEXTS[0])).tolist()[: 35 - 1]


def test_a_model_without_a_tokenizer_is_checked_on_random_ids():
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=16, layers=1)
    assert text_prompts(model, 64, 32) is None


def test_a_near_tie_within_the_steps_noise_agrees():
    ref = np.array([[3.0, 2.9, 0.0, -1.0], [3.0, 2.0, 0.0, -1.0]])
    # The file prefers token 1 at both steps; its rms error per step:
    got = ref + np.array([[-0.2, 0.2, 0.0, 0.0], [-0.6, 0.6, 0.0, 0.0]])
    noise = np.sqrt(np.mean((got - ref) ** 2, axis=-1))  # 0.141, 0.424
    # Step 0: gap 0.1 <= its noise, a near-tie; step 1: gap 1.0 > its noise.
    assert check._agrees(got, ref, noise).tolist() == [True, False]
    assert check._agrees(got, ref, np.zeros(2)).tolist() == [False, False]


def _refused(model, tmp_path, **options):
    with pytest.raises(ExportVerificationError) as info:
        to_litert_lm(
            model,
            tmp_path / "lm.tflite",
            max_sequence_length=24,
            prefill_lengths=(8,),
            quantize="int4",
            **options,
        )
    assert not os.listdir(tmp_path)
    return str(info.value)


def test_a_refusal_names_every_lever_and_min_agreement_accepts(tmp_path):
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=32, layers=1)
    message = _refused(model, tmp_path, min_agreement=1.0)
    for lever in ("'dynamic'", "'weight_only_int8'", "'float16'", "None"):
        assert lever in message.split("Export another mode")[1]
    assert "random ids" in message and "verify_inputs=" in message
    assert "--verify-data" in message and "--min-agreement" in message
    reached = float(message.split("top-1 agreement ")[1].split("%")[0]) / 100
    accepted = float(message.split("min_agreement=")[1].split(" ")[0])
    assert accepted == np.floor(reached * 100) / 100 < 1.0
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=24,
        prefill_lengths=(8,),
        quantize="int4",
        min_agreement=accepted,
    )
    assert result.check.min_agreement == accepted
    assert accepted <= result.check.agreement < 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "dynamic", "min_agreement": 1.5}, "min_agreement=1.5"),
        ({"quantize": "dynamic", "min_agreement": 0}, "min_agreement=0"),
        ({"quantize": "dynamic", "min_agreement": True}, "min_agreement=True"),
        ({"quantize": "dynamic", "min_agreement": "high"}, "min_agreement='high'"),
        ({"min_agreement": 0.9}, r"float32 file \(quantize=None\) is checked exactly"),
    ],
)
def test_bad_min_agreement_is_refused_by_name(tmp_path, options, message):
    keras.utils.set_random_seed(0)
    model = lm_models.kerasnorm_decoder(width=16, layers=1)
    with pytest.raises(ValueError, match=message):
        to_litert_lm(model, tmp_path / "a.tflite", max_sequence_length=8, **options)
    assert not os.listdir(tmp_path)


def test_the_command_line_takes_min_agreement(tmp_path, capsys):
    from kerasnorm_cli import command as main
    from kerasnorm_cli.exits import EXIT_USAGE

    keras.utils.set_random_seed(0)
    saved = tmp_path / "lm.keras"
    lm_models.kerasnorm_decoder(width=32, layers=1).save(saved)
    out = tmp_path / "out"
    argv = ["export", str(saved), "--out", str(out), "--format", "litert_lm"]
    argv += ["--max-sequence-length", "24", "--prefill-lengths", "8"]
    code = main([*argv, "--quantize", "int4", "--min-agreement", "1.0"])
    text = "".join(capsys.readouterr())
    assert code != 0
    assert "min_agreement=" in text and "--min-agreement" in text
    assert not out.exists() or not os.listdir(out)
    tflite = ["export", str(saved), "--out", str(out), "--tflite"]
    assert main([*tflite, "--min-agreement", "0.5"]) == EXIT_USAGE
    assert (
        "--min-agreement applies to --format litert_lm only" in capsys.readouterr().err
    )
