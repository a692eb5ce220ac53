"""Private parts of attention and decoder layers that a cached step reads.

A generative file writes each layer's keys and values into its own cache at
`input_pos`, which none of these layers' public calls does (keras-hub's
`call_with_cache` stacks every layer's cache into one tensor and repeats
grouped keys): the step reuses the layers' own projections, norms and rotary
layers, reached here. Checked on Keras 3.10 and 3.15.1, keras-hub 0.32.
"""

from types import SimpleNamespace


def attention_projections(attention):
    """The query, key, value and output `EinsumDense` layers of a Keras
    `MultiHeadAttention` (keras-hub's `CachedMultiHeadAttention` too):
    `_query_dense`, `_key_dense`, `_value_dense`, `_output_dense`, private
    since Keras 2.x with no public accessor."""
    return (
        attention._query_dense,
        attention._key_dense,
        attention._value_dense,
        attention._output_dense,
    )


def _parts(layer, **names):
    return SimpleNamespace(**{key: getattr(layer, name) for key, name in names.items()})


def transformer_decoder_parts(layer):
    """keras-hub `TransformerDecoder` (GPT-2's blocks): its norms, attention
    and feed-forward sub-layers, all private attributes."""
    return _parts(
        layer,
        normalize_first="normalize_first",
        attention_norm="_self_attention_layer_norm",
        attention="_self_attention_layer",
        ffn_norm="_feedforward_layer_norm",
        intermediate="_feedforward_intermediate_dense",
        output="_feedforward_output_dense",
    )


def llama_decoder_parts(layer):
    """keras-hub `LlamaTransformerDecoder` (and Mistral's, Qwen3's, which
    share its names): private norms, attention and gated feed-forward."""
    parts = _parts(
        layer,
        attention_norm="_self_attention_layernorm",
        attention="_self_attention_layer",
        ffn_norm="_feedforward_layernorm",
        gate="_feedforward_gate_dense",
        intermediate="_feedforward_intermediate_dense",
        output="_feedforward_output_dense",
    )
    attention = parts.attention
    parts.query, parts.key, parts.value, parts.out = attention_projections(attention)
    parts.query_norm = getattr(attention, "_query_dense_layer_norm", None)
    parts.key_norm = getattr(attention, "_key_dense_layer_norm", None)
    parts.scale = attention._inv_norm_factor
    # Mistral's window is private, Qwen3's public; Llama has none.
    parts.window = getattr(attention, "_sliding_window", None) or getattr(
        attention, "sliding_window_size", None
    )
    parts.activation = layer.activation
    return parts


def gemma_rope(attention, x, positions):
    """Gemma's rotary step, `CachedGemmaAttention._apply_rope`: keras-hub's
    `RotaryEmbedding` followed by Gemma's interleaved layout, at `positions`
    (the `positions=` path keras-hub added for vLLM, keras-hub 0.32)."""
    return attention._apply_rope(x, 0, positions=positions)
