"""The views through which keras-hub's cached call reads the file's caches
(`hub_step`): each layer's `(key, value)` pair as the attention indexes its
slice of the stacked cache (`Pair`, `Layers`), each key or value as
keras-hub's `[B, L, g, d]` held as the file's `[B, g, L, d]`
(`HeadsFirst`), and the `keras.ops` replacements that read that layout
while a step is traced: the cache write (`cache_write`: a decode step's
one row kept beside the cache, `HeadsFirst.row`, and written by the
step's output, `to_file`; a prefill's rows written), the repeat of
grouped keys (`repeat`), the attention's products (`einsum`), and the
masks from integer positions (`causal_mask`, `window_band`).
docs/design.md, "The generic step".
"""

from __future__ import annotations

from keras import ops

from kerasnorm._compat.hub_cache import as_keras_structure


class Pair:
    """Layer `i`'s `(key, value)` `[B, L, g, d]`, indexed as the attention
    indexes its slice of the stacked cache: `cache[:, 0, ...]` is the key."""

    def __init__(self, key, value):
        self.pair = (key, value)

    # Read when used, not when built: Keras' tree rebuilds the structure
    # around whatever it maps the tensors to (a dtype's name, a spec).
    @property
    def shape(self):
        key = self.pair[0]
        return (key.shape[0], 2, *key.shape[1:])

    @property
    def dtype(self):
        return self.pair[0].dtype

    def __getitem__(self, index):
        return self.pair[_pair_index(index)]

    def __len__(self):
        return 2

    def __tf_tensor__(self, dtype=None, name=None):
        # What `ops.shape(cache)` converts (the mask reads the cache's
        # length from it): the stack is unused past its static shape, and
        # the converter drops it.
        import tensorflow as tf

        return tf.stack(self.pair, axis=1, name=name)


as_keras_structure(Pair, lambda p: p.pair, lambda kv: Pair(*kv))


class Layers:
    """The stacked cache as a list of `Pair`s: `cache[:, i, ...]` is
    layer `i`'s."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __getitem__(self, index):
        return self.pairs[_pair_index(index)]


def _pair_index(index):
    """`i` of `[:, i, ...]` (or `[:, i]`, `[:, i, :, :, :]`)."""
    if (
        isinstance(index, tuple)
        and len(index) >= 2
        and index[0] == slice(None)
        and isinstance(index[1], int)
        and all(i in (Ellipsis, slice(None)) for i in index[2:])
    ):
        return index[1]
    raise TypeError(
        "to_litert_lm: the cached call indexed its cache with "
        f"{index!r}; the step hands each layer its own (key, value) pair, "
        "indexed as cache[:, i, ...]"
    )


class HeadsFirst:
    """A layer's key or value cache as keras-hub reads it, `[B, L, g * r,
    d]` (each head `r` times over, `ops.repeat(x, r, axis=2)`, where the
    attention repeats grouped keys), held as the file's `[B, g, L, d]`
    without either: the cache write (`cache_write`), the repeat (`repeat`)
    and the attention's products (`einsum`) read this layout, so a decode
    step moves no cache through a transpose or a repeat. Any other use
    gets the tensor keras-hub's layout would hold (`__tf_tensor__`).

    A decode step's write (`row`, `[B, g, 1, d]`, at row `start`) is kept
    beside the cache it was written to, not written into it: the
    attention's products read the cache as it came and the one row apart
    (`einsum`), and the step's output writes the row (`to_file`, one
    dynamic-update-slice after every delegated op)."""

    def __init__(self, tensor, repeats=1, row=None, start=None):
        self.tensor = tensor
        self.repeats = repeats
        self.row = row
        self.start = start

    @property
    def shape(self):
        b, g, length, d = self.tensor.shape
        return (b, length, None if g is None else g * self.repeats, d)

    @property
    def dtype(self):
        return self.tensor.dtype

    def __getitem__(self, index):
        # GPT-NeoX slices the whole cache's keys to rotate them each step.
        return _tensor(self)[index]

    def written(self):
        """The cache with its row written, `[B, g, L, d]`, in arithmetic
        (`written_row`): inside the step, where a dynamic-update-slice
        would split the delegated partition."""
        if self.row is None:
            return self.tensor
        start = (0, 0, self.start, 0)
        return written_row(ops.slice_update, self.tensor, start, self.row)

    def __tf_tensor__(self, dtype=None, name=None):
        import tensorflow as tf

        x = tf.transpose(self.written(), (0, 2, 1, 3))
        if self.repeats > 1:
            x = tf.repeat(x, self.repeats, axis=2)
        return x if dtype is None else tf.cast(x, dtype, name=name)


as_keras_structure(
    HeadsFirst,
    lambda x: (x.tensor,) if x.row is None else (x.tensor, x.row, x.start),
    lambda children, repeats: HeadsFirst(children[0], repeats, *children[1:]),
    metadata=lambda x: x.repeats,
)


def row_mask(cache, start):
    """`(L,)` in `cache`'s dtype: one at row `start` of a `[B, g, L, d]`
    cache, zero elsewhere."""
    length = cache.shape[2]
    hit = ops.equal(ops.arange(length, dtype="int32"), ops.cast(start, "int32"))
    return ops.cast(hit, cache.dtype)


def _tensor(x):
    """`x`, or the tensor in keras-hub's layout of a `HeadsFirst`."""
    return ops.convert_to_tensor(x.__tf_tensor__()) if isinstance(x, HeadsFirst) else x


def cache_write(original, inputs, start_indices, updates):
    """`ops.slice_update` of a cache: on a `HeadsFirst` (rows from
    `[0, index, 0, 0]`), the new rows turned heads first; one row (a
    decode step) kept beside the cache (`HeadsFirst.row`), several
    written along the file's length axis."""
    if (
        isinstance(inputs, HeadsFirst)
        and inputs.repeats == 1
        and len(start_indices) == 4
        and all(
            isinstance(start_indices[a], int) and start_indices[a] == 0
            for a in (0, 2, 3)
        )
    ):
        rows = ops.transpose(ops.cast(updates, inputs.dtype), (0, 2, 1, 3))
        if rows.shape[2] == 1 and inputs.row is None:
            return HeadsFirst(inputs.tensor, row=rows, start=start_indices[1])
        start = (0, 0, start_indices[1], 0)
        return HeadsFirst(written_row(original, inputs.written(), start, rows))
    return written_row(original, _tensor(inputs), start_indices, updates)


def repeat(original, x, repeats, axis=None):
    """`ops.repeat` of a cache's heads (axis 2), kept as a count on the
    `HeadsFirst`: `einsum` groups the other operand's heads instead."""
    if (
        isinstance(x, HeadsFirst)
        and isinstance(repeats, int)
        and repeats >= 1
        and axis in (2, -2)
    ):
        return HeadsFirst(x.tensor, x.repeats * repeats, x.row, x.start)
    return original(_tensor(x), repeats, axis=axis)


def einsum(original, subscripts, *operands, **kwargs):
    """`ops.einsum` of two operands, one a cache (`HeadsFirst`, letters
    `b l h d` in keras-hub's layout): the cache's letters reordered to the
    file's `b h l d`, the cache made the second operand; where its heads
    are repeated `r` times, the other operand's and the output's head axis
    `h` (query head `i` reads key head `i // r`, as `ops.repeat` lays them)
    split into `(h / r, r)` around one product, and the output's merged
    back. Anything else on the tensors in keras-hub's layout."""
    views = [i for i, x in enumerate(operands) if isinstance(x, HeadsFirst)]
    outer = _outer_product(subscripts, operands, views)
    if outer is not None:
        return outer
    grouped = _grouped_einsum(subscripts, operands, views)
    if grouped is None:
        return original(subscripts, *[_tensor(x) for x in operands], **kwargs)
    equation, x, view, merge = grouped
    if view.row is None:
        out = original(equation, x, view.tensor, **kwargs)
    else:
        out = _with_row(original, equation, x, view, kwargs)
    if merge is not None:
        shape = list(out.shape)
        shape[merge : merge + 2] = [shape[merge] * shape[merge + 1]]
        out = ops.reshape(out, shape)
    return out


def _outer_product(subscripts, operands, views):
    """An einsum of two tensors that shares and sums no letter, its output
    their letters in order (`"i,j->ij"`, Phi3's rotary angles from its
    scaled frequencies), as one broadcast product; None otherwise. The
    converter writes the einsum as a `FULLY_CONNECTED` whose weights are
    computed, which XNNPACK does not take, splitting the partition; the
    product of two numbers is the same either way."""
    subscripts = subscripts.replace(" ", "")
    if views or len(operands) != 2 or "->" not in subscripts or "." in subscripts:
        return None
    inputs, output = subscripts.split("->")
    a, b = inputs.split(",")
    if set(a) & set(b) or output != a + b or len(set(output)) != len(output):
        return None
    x, y = (ops.convert_to_tensor(t) for t in operands)
    x = ops.reshape(x, (*x.shape, *[1] * len(b))) if None not in x.shape else None
    if x is None or None in y.shape:
        return None
    return x * ops.reshape(y, (*[1] * len(a), *y.shape))


def _grouped_einsum(subscripts, operands, views):
    """`(equation, other operand, view, merged output axis or None)` for
    `einsum`, or None where it does not apply."""
    subscripts = subscripts.replace(" ", "")
    if (
        len(operands) != 2
        or len(views) != 1
        or "->" not in subscripts
        or "." in subscripts
    ):
        return None
    inputs, output = subscripts.split("->")
    terms = inputs.split(",")
    v = views[0]
    view, x = operands[v], operands[1 - v]
    if len(terms[v]) != 4 or len(set(terms[v])) != 4:
        return None
    b, length, h, d = terms[v]
    terms[v] = b + h + length + d
    merge = None
    if view.repeats > 1:
        other = terms[1 - v]
        shape = list(getattr(x, "shape", ()))
        if h not in other or h not in output or None in shape:
            return None
        free = [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in subscripts]
        axis = other.index(h)
        r = view.repeats
        if shape[axis] % r:
            return None
        x = ops.reshape(x, [*shape[:axis], shape[axis] // r, r, *shape[axis + 1 :]])
        terms[1 - v] = other[: axis + 1] + free[0] + other[axis + 1 :]
        merge = output.index(h)
        output = output[: merge + 1] + free[0] + output[merge + 1 :]
    # The cache second: the product's right-hand side, as the hand-written
    # attention has it. First (Keras' `MultiHeadAttention` writes
    # `einsum("aecd,abcd->acbe", key, query)`), it is a product of the
    # cache by one column, which XNNPACK's kernels pad to their width.
    return f"{terms[1 - v]},{terms[v]}->{output}", x, view, merge


def _with_row(original, equation, x, view, kwargs):
    """The einsum `equation` of `x` by the cache `view` (file layout, its
    length letter third) with its decode row written, computed from the
    cache as it came and the row apart: where the length is an output
    axis (the scores), the product's column at the row replaced by the
    product with the row; where it is summed (the weighted values), the
    sum without the row's term plus that term. Equal to the product by the
    written cache up to the order of a sum, and no cache-sized tensor is
    written."""
    inputs, output = equation.split("->")
    other, cache = inputs.split(",")
    length = cache[2]
    mask = row_mask(view.tensor, view.start)

    def along(term, dtype):
        shape = [1] * len(term)
        shape[term.index(length)] = view.tensor.shape[2]
        return ops.reshape(ops.cast(mask, dtype), shape)

    if length in output:
        full = original(equation, x, view.tensor, **kwargs)
        one = original(equation, x, view.row, **kwargs)
        m = along(output, full.dtype)
        return full * (1 - m) + one * m
    if length not in other:
        return original(equation, x, view.written(), **kwargs)
    m = along(other, x.dtype)
    full = original(equation, x * (1 - m), view.tensor, **kwargs)
    picked = ops.sum(x * m, axis=other.index(length), keepdims=True)
    return full + original(equation, picked, view.row, **kwargs)


def written_row(original, inputs, start_indices, updates):
    """`ops.slice_update` as arithmetic where it writes one row along one
    axis (from a known zero on every other); the update otherwise."""
    inputs = ops.convert_to_tensor(inputs)
    updates = ops.convert_to_tensor(updates)
    shape, rows = inputs.shape, updates.shape
    partial = [a for a in range(len(shape)) if rows[a] != shape[a]]
    if (
        len(partial) != 1
        or rows[partial[0]] != 1
        or None in shape
        or None in rows
        or not inputs.dtype.is_floating
        or not all(
            isinstance(start_indices[a], int) and start_indices[a] == 0
            for a in range(len(shape))
            if a != partial[0]
        )
    ):
        return original(inputs, start_indices, updates)
    axis = partial[0]
    length = shape[axis]
    hit = ops.equal(
        ops.arange(length, dtype="int32"),
        ops.cast(start_indices[axis], "int32"),
    )
    broadcast = [1] * len(shape)
    broadcast[axis] = length
    mask = ops.reshape(ops.cast(hit, inputs.dtype), broadcast)
    return inputs * (1 - mask) + ops.cast(updates, inputs.dtype) * mask


def causal_mask(batch_size, input_length, output_length, cache_index=0):
    """keras-hub's `compute_causal_mask` (`(batch, output_length,
    input_length)`, true where key `j <= cache_index + i`) compared in
    integers: its float arange plus the cast index is an `ADD` XNNPACK
    takes, between the positions and the comparison it does not, which
    split the decode step in two partitions. In integers the mask is
    computed from the positions before the first delegated op."""
    i = ops.arange(output_length, dtype="int32") + ops.cast(cache_index, "int32")
    j = ops.arange(input_length, dtype="int32")
    mask = ops.expand_dims(ops.greater_equal(i[:, None], j[None, :]), axis=0)
    return ops.broadcast_to(mask, (batch_size, output_length, input_length))


def to_hub(cache, dtype):
    """`(1, g, L, d)` as keras-hub's `(1, L, g, d)`, kept heads first."""
    return HeadsFirst(ops.cast(cache, dtype))


def to_file(cache):
    """A step's cache output `(1, g, L, d)` float32; a decode row written
    by a dynamic-update-slice, the cache's last op: its inputs are the
    step's cache input and the row, so every op before it stays in the
    delegated partition, and it writes one row where the arithmetic write
    computes the whole cache three times (LiteRT-LM's engine reads a
    step's caches from one buffer and writes them to another, so each
    step copies them once either way)."""
    if isinstance(cache, HeadsFirst) and cache.repeats == 1:
        if cache.row is not None:
            zero = ops.zeros((), "int32")
            start = (zero, zero, ops.cast(cache.start, "int32"), zero)
            return ops.slice_update(
                ops.cast(cache.tensor, "float32"),
                start,
                ops.cast(cache.row, "float32"),
            )
        return ops.cast(cache.tensor, "float32")
    return ops.cast(ops.transpose(_tensor(cache), (0, 2, 1, 3)), "float32")


def window_band(attention_mask, start, window):
    """`attention_mask` `(B, T, L)` and the band `|start + t - j| < window`
    (keras-hub's `band_part(ones, window - 1, window - 1)` at rows `start +
    t`), in integers."""
    _, length, keys = attention_mask.shape
    rows = ops.arange(length, dtype="int32")[:, None] + ops.cast(start, "int32")
    distance = ops.abs(rows - ops.arange(keys, dtype="int32")[None, :])
    band = ops.less(distance, ops.minimum(keys, window - 1) + 1)
    return ops.logical_and(attention_mask, band[None])
