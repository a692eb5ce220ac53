"""The fast int8 file of keras-hub's decoder backbones at 1 x 32 tokens:
Gemma, Gemma3, Llama, Mistral, Qwen3, Phi3 and GPT-2, from small configs
(random weights, nothing downloaded), calibrated on token sequences.

The export itself refuses a file over the int8 tolerance (rms 0.1 of the
output); the tests also read the error, and that the float islands the
measurement asked for are there (docs/design.md, "int8 of keras-hub
decoders")."""

from __future__ import annotations

import numpy as np
import pytest

from kerasnorm.export import to_tflite
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only

LENGTH = 32
VOCABULARY = lm_models.SIZES["decoder"]["vocabulary_size"]
FAMILIES = sorted(lm_models.BACKBONES)
# The two whose int8 file failed (rms 1.1): Gemma's scaled token lookup and
# keras-hub's reshaped scores.
DEFAULT_TIER = ("gemma",)


def _export(tmp_path, family):
    import keras

    keras.utils.set_random_seed(0)
    backbone = lm_models.backbone(family, "decoder")
    rng = np.random.default_rng(0)
    batches = [
        {
            "token_ids": rng.integers(0, VOCABULARY, (8, LENGTH)).astype("int32"),
            "padding_mask": np.ones((8, LENGTH), "int32"),
        }
        for _ in range(8)
    ]
    return to_tflite(
        backbone,
        tmp_path / f"{family}.tflite",
        quantize="int8",
        representative_data=batches,
        batch_size=1,
        input_signature={"token_ids": (None, LENGTH), "padding_mask": (None, LENGTH)},
    )


@pytest.mark.parametrize(
    "family",
    [
        f if f in DEFAULT_TIER else pytest.param(f, marks=pytest.mark.slow)
        for f in FAMILIES
    ],
)
def test_decoder_backbone_int8_at_32_tokens(tmp_path, family):
    result = _export(tmp_path, family)
    assert result.verification.criterion == "rms"
    assert result.verification.rms_rel_error <= 0.1
    # The scores stay float from their matmul to the softmax, reshapes too.
    assert "SOFTMAX" in result.float_ops
    assert "BATCH_MATMUL" in result.float_ops
    if family.startswith("gemma"):
        # The token lookup and its sqrt(hidden_dim) scale stay float.
        assert "GATHER" in result.float_ops
