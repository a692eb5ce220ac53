"""The layers a functional decoder attends through, each over one cache
pair: Keras' `MultiHeadAttention` (`cached_multi_head_attention`, public for
a `cached_step` of the user's own) and keras-hub's `TransformerDecoder`."""

from __future__ import annotations

import keras

from kerasnorm._compat import sublayers
from kerasnorm._compat.keras_attention import multi_head_attention_parts
from kerasnorm._compat.keras_attention import transformer_decoder_parts
from kerasnorm._core import attention as cached


def attention_step(attention, x, key_cache, value_cache, positions):
    """Keras' `MultiHeadAttention` over one cache pair: its projections,
    `cached_attention`, its output projection."""
    query, key, value, output, scale = multi_head_attention_parts(attention)
    y, key_cache, value_cache = cached.cached_attention(
        query(x), key(x), value(x), key_cache, value_cache, positions, scale
    )
    return output(y), (key_cache, value_cache)


def cached_multi_head_attention(attention, x, key_cache, value_cache, positions):
    """A `keras.layers.MultiHeadAttention` called as `attention(x, x,
    use_causal_mask=True)`, over a key/value cache: for the `cached_step`
    of a layer of your own around one (`docs/guides/generation.md`, "Your
    own decoder").

    Args:
        attention: the `MultiHeadAttention` layer (value_dim == key_dim).
        x: `(batch, T, width)`, the new tokens' inputs.
        key_cache: `(batch, num_heads, L, key_dim)`, the keys so far.
        value_cache: `(batch, num_heads, L, key_dim)`, the values so far.
        positions: `(T,)` int, the consecutive positions of the new tokens.

    Returns:
        `(output (batch, T, width), (key_cache, value_cache))`.
    """
    return attention_step(attention, x, key_cache, value_cache, positions)


def hub_decoder_step(layer, x, key_cache, value_cache, positions):
    """keras-hub `TransformerDecoder` (decoder-only) over one cache pair: its
    own norms, attention projections and feed-forward layers, its call's
    order (`normalize_first` or after), the attention through
    `cached_attention`. Its `self_attention_cache` path would write the
    cache with a dynamic-update-slice per decode step, which splits the
    decode step's XNNPACK partition at every layer; a padding mask on `x`
    (`mask_zero`) is not merged in, as keras-hub's cached call merges none
    (rows past the prompt are hidden by the causal mask)."""
    p = transformer_decoder_parts(layer)
    h = p.attention_norm(x) if p.normalize_first else x
    h, caches = attention_step(p.attention, h, key_cache, value_cache, positions)
    x = x + h if p.normalize_first else p.attention_norm(x + h)
    h = p.ffn_norm(x) if p.normalize_first else x
    h = p.output(p.intermediate(h))
    x = x + h if p.normalize_first else p.ffn_norm(x + h)
    return x, caches


def protocol_cache_shape(op):
    """`(g, d)` of the cache of a layer with the `cached_step` protocol: its
    `cache_shape`, else its `num_heads` and `key_dim`, else those of the one
    `MultiHeadAttention` inside it; None when none of these says."""
    shape = getattr(op, "cache_shape", None)
    if (
        shape is None
        and isinstance(getattr(op, "num_heads", None), int)
        and isinstance(getattr(op, "key_dim", None), int)
    ):
        shape = (op.num_heads, op.key_dim)
    if shape is None:
        found = [
            layer
            for layer in sublayers(op, recursive=True)
            if isinstance(layer, keras.layers.MultiHeadAttention)
        ]
        if len(found) == 1:
            shape = (found[0].num_heads, found[0].key_dim)
    return None if shape is None else tuple(int(s) for s in shape)
