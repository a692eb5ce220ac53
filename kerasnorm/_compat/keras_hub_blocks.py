"""Which norm of a keras-hub decoder block feeds which linear layers.

keras-hub 0.32's decoder blocks are subclassed layers: no graph says that a
block's pre-attention norm is read by the attention's query, key and value
projections only (the residual stream reads the block's input, not the
norm's output). The table below says it per block class, by the attribute
paths the classes set in `__init__` (several private); checked on
keras-hub 0.32 by the smoothing tests, which compare the smoothed block's
function with the original's.
"""

from __future__ import annotations

_ATTENTION = ("query", "key", "value")
_GEMMA = (
    ("pre_attention_norm", tuple(f"attention.{k}_dense" for k in _ATTENTION)),
    ("pre_ffw_norm", ("gating_ffw", "gating_ffw_2")),
)
_LLAMA = (
    (
        "_self_attention_layernorm",
        tuple(f"_self_attention_layer._{k}_dense" for k in _ATTENTION),
    ),
    (
        "_feedforward_layernorm",
        ("_feedforward_intermediate_dense", "_feedforward_gate_dense"),
    ),
)
_PHI3 = (
    ("pre_attention_layernorm", tuple(f"attention.{k}_dense" for k in _ATTENTION)),
    (
        "post_attention_layernorm",
        ("feedforward_intermediate_dense", "feedforward_gate_dense"),
    ),
)
# keras_hub.layers.TransformerDecoder (GPT-2) when it normalizes first and
# has no cross-attention.
_PRE_LN_DECODER = (
    (
        "_self_attention_layer_norm",
        tuple(f"_self_attention_layer._{k}_dense" for k in _ATTENTION),
    ),
    ("_feedforward_layer_norm", ("_feedforward_intermediate_dense",)),
)
BLOCKS = {
    "GemmaDecoderBlock": _GEMMA,
    "Gemma3DecoderBlock": _GEMMA,
    "LlamaTransformerDecoder": _LLAMA,
    "MistralTransformerDecoder": _LLAMA,
    "Qwen3TransformerDecoder": _LLAMA,
    "Phi3Decoder": _PHI3,
    "TransformerDecoder": _PRE_LN_DECODER,
}
# The gated feed-forward of a block: the linear product multiplied by the
# activated gate (`act(gate(x)) * up(x)`) and the product reading it. The
# up product's output channel `j` scaled by `1 / s_j` and the down
# product's input row `j` by `s_j` compute the same function.
_GATED = {
    "GemmaDecoderBlock": ("gating_ffw_2", "ffw_linear"),
    "Gemma3DecoderBlock": ("gating_ffw_2", "ffw_linear"),
    "LlamaTransformerDecoder": (
        "_feedforward_intermediate_dense",
        "_feedforward_output_dense",
    ),
    "MistralTransformerDecoder": (
        "_feedforward_intermediate_dense",
        "_feedforward_output_dense",
    ),
    "Qwen3TransformerDecoder": (
        "_feedforward_intermediate_dense",
        "_feedforward_output_dense",
    ),
}
# keras-hub norms whose gain is `1 + scale` (Gemma's RMSNormalization).
ONE_PLUS_SCALE = ("RMSNormalization",)


def _is_keras_hub(layer):
    return type(layer).__module__.startswith("keras_hub.")


def decoder_norm_readers(block):
    """`[(norm, [linear layers reading its output only])]` for a keras-hub
    decoder block this table knows, else `[]`."""
    table = BLOCKS.get(type(block).__name__)
    if table is None or not _is_keras_hub(block):
        return []
    if type(block).__name__ == "TransformerDecoder" and (
        not getattr(block, "normalize_first", False)
        or getattr(block, "_cross_attention_layer", None) is not None
    ):
        return []
    found = []
    for norm_path, reader_paths in table:
        norm = _attribute(block, norm_path)
        readers = [_attribute(block, path) for path in reader_paths]
        if norm is not None and all(r is not None for r in readers):
            found.append((norm, readers))
    return found


def gated_readers(block):
    """`[(up, down)]`: the linear product of a keras-hub block's gated
    feed-forward that the activated gate multiplies, and the product
    reading that product, for a block class this table knows; else `[]`."""
    paths = _GATED.get(type(block).__name__)
    if paths is None or not _is_keras_hub(block):
        return []
    up, down = (_attribute(block, path) for path in paths)
    return [] if up is None or down is None else [(up, down)]


def gain_offset(norm):
    """1 for a keras-hub norm computing `n(x) * (1 + scale)`, else 0."""
    return 1.0 if _is_keras_hub(norm) and type(norm).__name__ in ONE_PLUS_SCALE else 0.0


def _attribute(layer, path):
    for name in path.split("."):
        layer = getattr(layer, name, None)
        if layer is None:
            return None
    return layer
