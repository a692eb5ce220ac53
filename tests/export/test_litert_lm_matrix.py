"""The generative export's matrix: model family x quantize mode x prefill
lengths x context, each model trained briefly on the sequence rule."""

import keras
import numpy as np
import pytest

from kerasnorm.export import to_litert_lm
from tests.export import lm_models

# The oldest-stack pass installs no keras-hub.
keras_hub = pytest.importorskip("keras_hub")

# One worker under `-n 2 --dist loadgroup` (.ci/run): each family is trained
# once (`trained`), not once per worker.
pytestmark = [pytest.mark.tf_only, pytest.mark.slow]

FAMILIES = {
    "llama": lambda: lm_models.causal_lm("llama"),
    "mistral": lambda: lm_models.causal_lm("mistral", sliding_window=64),
    "qwen3": lambda: lm_models.causal_lm("qwen3", head_dim=16),
    "gpt2": lambda: lm_models.causal_lm("gpt2", num_query_heads=2),
    "gemma": lambda: lm_models.causal_lm("gemma", head_dim=8),
    "pre_rms": lambda: lm_models.kerasnorm_decoder("pre", "rms"),
    "deepnorm_rms": lambda: lm_models.kerasnorm_decoder("deepnorm", "rms"),
    "pre_layer_posemb": lambda: lm_models.kerasnorm_decoder(
        "pre", "layer", position="learned"
    ),
    "post_layer": lambda: lm_models.kerasnorm_decoder("post", "layer"),
}


_TRAINED = {}


def trained(family):
    if family not in _TRAINED:
        keras.utils.set_random_seed(0)
        model = FAMILIES[family]()
        lm_models.train(model, steps=200)
        _TRAINED[family] = model
    return _TRAINED[family]


MODES = [(None, (8,), 24), ("dynamic", (4, 16), 32), ("float16", (4,), 24)]


# A family's cells run on one test process, which trains its model once;
# the families spread over CI's two. CI's slow tier runs each family in
# one mode (family i in mode i mod 3: each mode on three families); the
# other cells of the product are `exhaustive` (`lm_models.one_mode_each`).
@pytest.mark.parametrize(
    "family, quantize, prefill_lengths, context",
    list(lm_models.one_mode_each(FAMILIES, MODES, "lm-matrix")),
)
def test_family_mode_prefill_context(
    family, quantize, prefill_lengths, context, tmp_path
):
    model = trained(family)
    prompts = lm_models.rule_sequences(2, seed=11)[:, :5]
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=context,
        prefill_lengths=prefill_lengths,
        quantize=quantize,
        verify_inputs=prompts,
    )
    if quantize is None:
        assert result.check.max_error <= 1e-4
        assert result.check.agreement == 1.0
        # Every family's decode step is one XNNPACK partition.
        assert result.delegation.partitions == 1, result.delegation
        assert "DYNAMIC_UPDATE_SLICE" not in result.delegation.undelegated
    else:
        assert result.check.agreement >= 0.9
    # 12 generated steps of each prompt, and each prefill's last row.
    assert result.check.steps == 24 + len(prefill_lengths)
    assert np.isfinite(result.check.rms_error)
