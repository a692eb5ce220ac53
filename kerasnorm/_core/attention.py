"""Attention over a key/value cache: the one computation the decoder block's
cached call and the generative `.tflite` export share.

A layer's cache is two tensors `K, V` of shape `(batch, g, L, d)`: `g`
key/value heads, `L` positions, head size `d` (heads before time: the
layout LiteRT-LM's engine reads its context length from). A call writes the
keys and values of its `T` new tokens at rows `positions[0] ..
positions[0] + T - 1` (one dynamic-update-slice: the rows are consecutive,
so a prompt padded with any positions still writes its padding past the
prompt, where later steps overwrite it) and each query at
position `p` attends to the rows `j <= p`, through an additive bias made
from `positions` (`causal_bias`), so that padding written past the prompt
stays hidden until a later step overwrites it. The `h` query heads are
grouped over the `g` key/value heads by a reshape (head `i` reads head
`i // (h / g)`), never by repeating the keys.
"""

from keras import ops

# Added to the scores of hidden rows: exp() of it underflows to 0 in float32
# and float16, and it stays finite, so a sum with any score is no NaN.
MASKED = -1e9


def rotate(x, positions, max_wavelength=10000.0):
    """Rotary position embedding of `x` `(batch, T, heads, d)` at `positions`.

    The half-split convention (keras-hub's `RotaryEmbedding`, Llama): the
    first and second halves of each head are the two coordinates of `d / 2`
    planes, plane `i` turned by `position * max_wavelength ** (-2 i / d)`.
    `positions` is `(T,)`, the position of each row, not its index.
    """
    d = x.shape[-1]
    inverse = ops.power(
        ops.cast(max_wavelength, "float32"),
        -ops.arange(0, d, 2, dtype="float32") / d,
    )
    angles = ops.cast(positions, "float32")[:, None] * inverse[None, :]
    angles = ops.concatenate([angles, angles], axis=-1)[None, :, None, :]
    cos = ops.cast(ops.cos(angles), x.dtype)
    sin = ops.cast(ops.sin(angles), x.dtype)
    first, second = ops.split(x, 2, axis=-1)
    return x * cos + ops.concatenate([-second, first], axis=-1) * sin


def causal_bias(positions, length, dtype="float32"):
    """`(T, length)`: 0 where row `j <= positions[t]`, `MASKED` elsewhere.

    A product of a comparison by a constant, not a select: the file's graph
    keeps builtin arithmetic that XNNPACK takes.
    """
    rows = ops.arange(length, dtype="int32")[None, :]
    hidden = ops.cast(ops.greater(rows, ops.cast(positions, "int32")[:, None]), dtype)
    return hidden * MASKED


def update_cache(cache, new, start):
    """`cache` `(batch, g, L, d)` with `new` `(batch, T, g, d)` written from
    row `start`."""
    zero = ops.zeros((), "int32")
    new = ops.transpose(ops.cast(new, cache.dtype), (0, 2, 1, 3))
    return ops.slice_update(cache, (zero, zero, ops.cast(start, "int32"), zero), new)


def grouped_attention(query, key, value, bias, scale, soft_cap=None, row=None):
    """Softmax attention of `query` `(b, T, h, d)` over `key`, `value`
    `(b, g, S, d)` with the additive `bias` `(T, S)`; `(b, T, h, d)` back.

    Query head `i` reads key/value head `i // (h / g)`: the queries are
    reshaped to `(b, T, g, h / g, d)` so one product serves a group.

    `row`: `(key_row, value_row, mask)`, a decode step's new key and value
    `(b, g, 1, d)` and `mask` `(S,)` one at the row they are written to:
    the attention over the caches with that row written, computed from the
    caches as they came and the row apart (the scores' column at the row
    replaced, the row's term of the weighted sum added apart), equal up to
    the order of a sum and with no cache-sized tensor written.
    """
    b, t, h, d = query.shape
    g = key.shape[1]
    b = ops.shape(query)[0] if b is None else b
    t = ops.shape(query)[1] if t is None else t
    grouped = ops.reshape(query, (b, t, g, h // g, d))
    scores = ops.einsum("btgrd,bgsd->bgrts", grouped, key)
    if row is not None:
        key_row, value_row, mask = row
        one = ops.einsum("btgrd,bgsd->bgrts", grouped, key_row)
        m = ops.cast(mask, scores.dtype)
        scores = scores * (1 - m) + one * m
    scores = ops.cast(scores, "float32") * scale
    if soft_cap is not None:
        scores = ops.tanh(scores / soft_cap) * soft_cap
    weights = ops.cast(ops.softmax(scores + bias, axis=-1), value.dtype)
    if row is None:
        out = ops.einsum("bgrts,bgsd->btgrd", weights, value)
    else:
        m = ops.cast(mask, weights.dtype)
        out = ops.einsum("bgrts,bgsd->btgrd", weights * (1 - m), value)
        picked = ops.sum(weights * m, axis=-1, keepdims=True)
        out = out + ops.einsum("bgrts,bgsd->btgrd", picked, value_row)
    return ops.reshape(out, (b, t, h, d))


def cached_attention(
    query, key, value, key_cache, value_cache, positions, scale, soft_cap=None
):
    """Write `key`, `value` into the caches at `positions` and attend.

    Returns `(output (b, T, h, d), key_cache, value_cache)`.

    A decode step (one new row) attends to the caches as they came and the
    row apart (`grouped_attention`'s `row`), and its caches are written by
    one dynamic-update-slice each that nothing in the step reads: in the
    file they are its last ops, after every delegated one (XNNPACK has no
    dynamic-update-slice; one inside the step would split its partition),
    and each copies its cache once, where writing the row in arithmetic
    (`cache * (1 - m) + new * m`) computed the whole cache three times.
    """
    length = key_cache.shape[2]
    bias = causal_bias(positions, length)
    written_key = update_cache(key_cache, key, positions[0])
    written_value = update_cache(value_cache, value, positions[0])
    if key.shape[1] != 1:
        out = grouped_attention(
            query, written_key, written_value, bias, scale, soft_cap
        )
        return out, written_key, written_value
    hit = ops.equal(ops.arange(length, dtype="int32"), ops.cast(positions[0], "int32"))
    row = (
        ops.transpose(ops.cast(key, key_cache.dtype), (0, 2, 1, 3)),
        ops.transpose(ops.cast(value, value_cache.dtype), (0, 2, 1, 3)),
        ops.cast(hit, key_cache.dtype),
    )
    out = grouped_attention(
        query, key_cache, value_cache, bias, scale, soft_cap, row=row
    )
    return out, written_key, written_value
