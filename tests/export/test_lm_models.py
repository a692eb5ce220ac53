"""The one builder of small keras-hub language models (tests.export.lm_models):
the model keras-hub's own constructors make from the same configuration,
and its refusals."""

import keras
import numpy as np
import pytest

from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")


def _seeded(build):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return build()


@pytest.mark.parametrize(
    ("builder", "reference"),
    [
        (
            lambda: lm_models.causal_lm("gpt2", num_query_heads=2),
            lambda: keras_hub.models.GPT2CausalLM(
                keras_hub.models.GPT2Backbone(
                    vocabulary_size=lm_models.VOCAB,
                    num_layers=2,
                    num_heads=2,
                    hidden_dim=32,
                    intermediate_dim=64,
                    max_sequence_length=64,
                ),
                preprocessor=None,
            ),
        ),
        (
            lambda: lm_models.backbone("gemma3", "decoder"),
            lambda: keras_hub.models.Gemma3Backbone(
                vocabulary_size=256,
                image_size=None,
                num_layers=2,
                num_query_heads=2,
                num_key_value_heads=1,
                hidden_dim=32,
                intermediate_dim=64,
                head_dim=16,
            ),
        ),
    ],
    ids=["gpt2_causal_lm", "gemma3_backbone"],
)
def test_builder_is_keras_hubs_constructor(builder, reference):
    got, want = _seeded(builder), _seeded(reference)
    assert type(got) is type(want)
    assert got.get_config() == want.get_config()
    for a, b in zip(got.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_seed_and_named_size():
    keras.backend.clear_session()
    a = lm_models.backbone("llama", "quick", seed=3, num_layers=1)
    keras.backend.clear_session()
    b = lm_models.backbone("llama", "quick", seed=3, num_layers=1)
    assert a.vocabulary_size == 512 and a.num_layers == 1
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"family": "bert"}, r"family must be one of .*Received: family='bert'"),
        ({"family": "llama", "size": "huge"}, r"Received: size='huge'"),
        (
            {"family": "phi3", "head_dim": 5},
            r"hidden_dim / num_query_heads = 8\. Received: head_dim=5",
        ),
    ],
)
def test_refusals_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lm_models.backbone(**kwargs)
