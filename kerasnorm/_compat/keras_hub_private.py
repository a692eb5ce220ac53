"""keras-hub's private modules that `litert_lm` reads, in one place.

keras-hub exports its models, tokenizers and layers from `keras_hub.models`
and `keras_hub.tokenizers`, but not two things `to_litert_lm` needs:

- GPT-NeoX's attention class (`keras_hub.src.models.gpt_neo_x`), to find the
  rotary layers whose cached call rotates the query from position 0 (the
  correction `families.QUERY_ROTATION_FROM_START` names);
- the byte-pair tokenizers' split pattern in the `tokenizers` library's
  syntax (`keras_hub.src.tokenizers.byte_pair_tokenizer`), to write a
  `tokenizer.json` that splits text as keras-hub does.

Checked on keras-hub 0.32 (the floor of the `litert_lm` extra). Where a
release moves them, the GPT-NeoX lookup finds no layer (the correction
is skipped, and the check against the forward pass says so), and the split
pattern raises an ImportError naming this module.
"""

from __future__ import annotations

from kerasnorm._compat.hub_cache import sublayers


def gpt_neox_rotary_layers(backbone):
    """The rotary layers of `backbone`'s GPT-NeoX attentions (none where
    keras-hub has no such class)."""
    try:
        from keras_hub.src.models.gpt_neo_x.gpt_neo_x_attention import GPTNeoXAttention
    except ImportError:  # pragma: no cover - keras-hub moved it
        return []
    return [
        layer.rotary_embedding_layer
        for layer in sublayers(backbone)
        if isinstance(layer, GPTNeoXAttention)
    ]


def byte_pair_split_pattern():
    """keras-hub's byte-pair split regex, as the `tokenizers` library
    spells it (`SPLIT_PATTERN_TOKENIZERS`)."""
    try:
        from keras_hub.src.tokenizers.byte_pair_tokenizer import (
            SPLIT_PATTERN_TOKENIZERS,
        )
    except ImportError as error:  # pragma: no cover - keras-hub moved it
        raise ImportError(
            "kerasnorm._compat.keras_hub_private: keras-hub no longer has "
            "keras_hub.src.tokenizers.byte_pair_tokenizer.SPLIT_PATTERN_TOKENIZERS "
            "(checked on keras-hub 0.32); pass tokenizer= the model's own "
            "`tokenizer.json` path."
        ) from error
    return SPLIT_PATTERN_TOKENIZERS
