"""Keras' `MultiHeadAttention` parts a cached step reads (see
`kerasnorm._compat`)."""


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
