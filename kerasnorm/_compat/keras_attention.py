"""Keras' `MultiHeadAttention` parts a cached step reads, and those of
keras-hub's `TransformerDecoder` around one (see `kerasnorm._compat`).

A generative file writes each layer's keys and values into its own cache
at `input_pos`, which none of these layers' public calls does: the
functional decoder's step (`litert_lm.graph_step`) reuses the layers' own
projections and norms, reached here. Checked on Keras 3.10 and 3.15.1,
keras-hub 0.32.
"""

from types import SimpleNamespace


def multi_head_attention_parts(attention):
    """The query, key, value and output `EinsumDense` layers of a Keras
    `MultiHeadAttention`, and its score scale `1 / sqrt(key_dim)`.

    A generative file writes each layer's keys and values into its own cache
    at `input_pos`; the layer's call has no cache argument, so the cached
    step runs its own projections around `kerasnorm._core.attention`. Keras
    3.15.1 exposes them as the properties `query_dense`, ... `output_dense`;
    where those are absent (older Keras), the attributes behind them,
    `_query_dense`, ..., private since Keras 2 (checked on keras 3.10.0 and
    3.15.1). The scale is the one Keras applies (`_inverse_sqrt_key_dim`,
    `1 / sqrt(key_dim)` in both), computed here from the public `key_dim`.
    """
    names = ("query_dense", "key_dense", "value_dense", "output_dense")
    parts = tuple(
        getattr(attention, name, None) or getattr(attention, "_" + name)
        for name in names
    )
    return (*parts, 1.0 / float(attention.key_dim) ** 0.5)


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


def transformer_decoder_parts(layer):
    """keras-hub `TransformerDecoder`: its norms, attention and feed-forward
    sub-layers, all private attributes."""
    names = {
        "normalize_first": "normalize_first",
        "attention_norm": "_self_attention_layer_norm",
        "attention": "_self_attention_layer",
        "ffn_norm": "_feedforward_layer_norm",
        "intermediate": "_feedforward_intermediate_dense",
        "output": "_feedforward_output_dense",
    }
    return SimpleNamespace(**{key: getattr(layer, name) for key, name in names.items()})
