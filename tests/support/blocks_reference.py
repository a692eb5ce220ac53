"""Transformer blocks rebuilt from plain Keras layers, written from docs/design.md §3.

Independent of kerasnorm: `keras.layers.MultiHeadAttention`, `Dense`,
`LayerNormalization` and `RMSNormalization`, loaded with the weights of a
kerasnorm block, and the residual formulas spelled out again.
"""

import keras
import numpy as np


def alpha_for(position, role, n=None, m=None):
    """DeepNorm's alpha from docs/design.md §3 (1 for Pre-/Post-LN)."""
    if position != "deepnorm":
        return 1.0
    if role == "encoder":
        return (2 * n) ** 0.25 if m is None else 0.81 * (n**4 * m) ** (1 / 16)
    return (2 * m) ** 0.25 if n is None else (3 * m) ** 0.25


def _norm(norm_type, residual, epsilon):
    if norm_type == "layer":
        norm = keras.layers.LayerNormalization(epsilon=epsilon)
    else:
        norm = keras.layers.RMSNormalization(epsilon=epsilon)
    weights = residual.norm.get_weights()
    norm.build((None, weights[0].shape[0]))
    norm.set_weights(weights)
    return norm


def _attention(residual, query, value):
    sub = residual.sublayer.attention
    mha = keras.layers.MultiHeadAttention(sub.num_heads, sub.key_dim)
    mha(query, value)
    mha.set_weights(sub.get_weights())
    return mha


def _feed_forward(residual, width, activation):
    sub = residual.sublayer
    inner = keras.layers.Dense(sub.intermediate_dim, activation=activation)
    outer = keras.layers.Dense(width)
    inner.build((None, width))
    outer.build((None, sub.intermediate_dim))
    inner.set_weights(sub.intermediate.get_weights())
    outer.set_weights(sub.output_dense.get_weights())
    return lambda h: outer(inner(h))


def _residual(x, f, norm, position, alpha):
    if position == "pre":
        return x + f(norm(x))
    if position == "post":
        return norm(x + f(x))
    return norm(alpha * x + f(x))


def encoder(block, x, *, position, norm_type, alpha, mask=None, epsilon=1e-5):
    """x: (B, T, D); mask: optional (B, T, T) boolean attention mask."""
    # A backend tensor: numpy + torch.Tensor is not defined on PyTorch.
    x = keras.ops.convert_to_tensor(x)
    mha = _attention(block.self_attention, x, x)
    n1 = _norm(norm_type, block.self_attention, epsilon)
    n2 = _norm(norm_type, block.feed_forward, epsilon)
    ffn = _feed_forward(block.feed_forward, x.shape[-1], "gelu")
    h = _residual(x, lambda h: mha(h, h, attention_mask=mask), n1, position, alpha)
    return keras.ops.convert_to_numpy(_residual(h, ffn, n2, position, alpha))


def decoder(block, x, context=None, *, position, norm_type, alpha, epsilon=1e-5):
    """Causal self-attention, cross-attention to `context` if given, FFN."""
    x = keras.ops.convert_to_tensor(x)
    mha = _attention(block.self_attention, x, x)
    n1 = _norm(norm_type, block.self_attention, epsilon)
    h = _residual(x, lambda h: mha(h, h, use_causal_mask=True), n1, position, alpha)
    if context is not None:
        cross = _attention(block.cross_attention, x, context)
        nc = _norm(norm_type, block.cross_attention, epsilon)
        h = _residual(h, lambda h: cross(h, context), nc, position, alpha)
    n2 = _norm(norm_type, block.feed_forward, epsilon)
    ffn = _feed_forward(block.feed_forward, x.shape[-1], "gelu")
    return keras.ops.convert_to_numpy(_residual(h, ffn, n2, position, alpha))


def randomize(layer, seed=0):
    """Move every weight of a built layer (norm gains included) off its init."""
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        value = np.asarray(w.numpy(), dtype="float32")
        w.assign(value + 0.2 * rng.standard_normal(value.shape).astype("float32"))
