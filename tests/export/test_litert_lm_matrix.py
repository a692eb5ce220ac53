"""The generative export's matrix: model family x quantize mode x prefill
lengths x context, each model trained briefly on the sequence rule."""

import keras
import numpy as np
import pytest

from kerasnorm.export import to_litert_lm
from tests.export import lm_models

# The oldest-stack pass installs no keras-hub.
keras_hub = pytest.importorskip("keras_hub")

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]
V = lm_models.VOCAB


def _llama():
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=V,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    )
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def _gpt2():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=V,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=64,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _gemma():
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=V,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=8,
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def _mistral():
    backbone = keras_hub.models.MistralBackbone(
        vocabulary_size=V,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        sliding_window=64,
    )
    return keras_hub.models.MistralCausalLM(backbone=backbone, preprocessor=None)


def _qwen3():
    backbone = keras_hub.models.Qwen3Backbone(
        vocabulary_size=V,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_dim=32,
        intermediate_dim=64,
    )
    return keras_hub.models.Qwen3CausalLM(backbone=backbone, preprocessor=None)


FAMILIES = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen3": _qwen3,
    "gpt2": _gpt2,
    "gemma": _gemma,
    "pre_rms": lambda: lm_models.kerasnorm_decoder("pre", "rms"),
    "deepnorm_rms": lambda: lm_models.kerasnorm_decoder("deepnorm", "rms"),
    "pre_layer_posemb": lambda: lm_models.kerasnorm_decoder(
        "pre", "layer", position="learned"
    ),
    "post_layer": lambda: lm_models.kerasnorm_decoder("post", "layer"),
}


class _HubAdapter(keras.Model):
    """Trains a CausalLM on plain token arrays (its call takes a dict)."""

    def __init__(self, lm):
        super().__init__(name="hub_adapter")
        self.lm = lm

    def call(self, tokens):
        return self.lm({"token_ids": tokens, "padding_mask": tokens > -1})


_TRAINED = {}


def trained(family):
    if family not in _TRAINED:
        keras.utils.set_random_seed(0)
        model = FAMILIES[family]()
        fit = (
            _HubAdapter(model)
            if isinstance(model, keras_hub.models.CausalLM)
            else model
        )
        lm_models.train(fit, steps=200)
        _TRAINED[family] = model
    return _TRAINED[family]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(
    "quantize, prefill_lengths, context",
    [(None, (8,), 24), ("dynamic", (4, 16), 32), ("float16", (4,), 24)],
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
    assert result.check.steps == 24
    assert np.isfinite(result.check.rms_error)
