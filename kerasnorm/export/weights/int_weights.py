"""Integer weights: symmetric int8 per row, int4 in blocks, each rounded to
nearest or by GPTQ on the product's inputs, and LiteRT's packed int4
layout (`weights.quantize` writes them into a flatbuffer)."""

from __future__ import annotations

import hashlib

import numpy as np


def int8_rows(weights):
    """Symmetric int8 per row of a 2-D array: `(q int8, scale float32 (rows,))`
    with `weights ~= q * scale[:, None]`; computed in chunks of rows, for
    large tables (a float temporary of the whole table is its size again)."""
    weights = np.asarray(weights, np.float32)
    rows, cols = weights.shape
    q = np.empty((rows, cols), np.int8)
    scale = np.empty(rows, np.float32)
    chunk = max(1, (1 << 22) // max(cols, 1))
    for start in range(0, rows, chunk):
        part = weights[start : start + chunk]
        top = np.abs(part).max(axis=1) / 127.0
        top = np.where(top > 0, top, 1.0).astype(np.float32)
        q[start : start + chunk] = np.clip(np.rint(part / top[:, None]), -127, 127)
        scale[start : start + chunk] = top
    return q, scale


def int4_blocks(weights, block_size):
    """Symmetric int4 in blocks of `block_size` along axis 1: `(q int8 in
    [-8, 7], scale float16 (rows, cols // block_size))`.

    Each block's scale is the one of `CLIP_RATIOS` times `max|w| / 7` whose
    rounding error is least (a slightly clipped range rounds the many small
    weights finer); computed in chunks of rows, for large tables."""
    weights = np.asarray(weights, np.float32)
    rows, cols = weights.shape
    q = np.empty((rows, cols), np.int8)
    scale = np.empty((rows, cols // block_size), np.float16)
    chunk = max(1, (1 << 22) // cols)
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        q[start:stop], scale[start:stop] = _int4_chunk(weights[start:stop], block_size)
    return q, scale


# Fractions of `max|w| / 7` tried as a block's scale.
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


def _int4_chunk(weights, block_size):
    rows, cols = weights.shape
    blocks = weights.reshape(rows, cols // block_size, block_size)
    top = np.abs(blocks).max(axis=2) / 7.0
    top = np.where(top > 0, top, 1.0)
    best_q, best_scale, best_error = None, None, None
    for ratio in CLIP_RATIOS:
        scale = _bfloat16_rounded(top * ratio).astype(np.float16)
        step = scale.astype(np.float32)[:, :, None]
        q = np.clip(np.rint(blocks / step), -8, 7)
        error = np.sum((q * step - blocks) ** 2, axis=2)
        if best_q is None:
            best_q, best_scale, best_error = q, scale, error
            continue
        better = error < best_error
        best_q = np.where(better[:, :, None], q, best_q)
        best_scale = np.where(better, scale, best_scale)
        best_error = np.minimum(error, best_error)
    return best_q.astype(np.int8).reshape(rows, cols), best_scale


def _bfloat16_rounded(x):
    """float32 rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return (rounded & np.uint32(0xFFFF0000)).view(np.float32)


def pack_int4(q):
    """int4 values (int8 array) two per byte, the even index in the low
    nibble (LiteRT's packed INT4 layout)."""
    flat = q.reshape(-1).astype(np.uint8) & np.uint8(0x0F)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return flat[0::2] | (flat[1::2] << np.uint8(4))


def unpack_int4(packed, count):
    """The inverse of `pack_int4`: `count` int4 values as int8."""
    packed = np.asarray(packed, np.uint8)
    low = (packed & np.uint8(0x0F)).astype(np.int8)
    high = (packed >> np.uint8(4)).astype(np.int8)
    values = np.stack([low, high], axis=1).reshape(-1)[:count]
    return np.where(values > 7, values - 16, values).astype(np.int8)


def weights_key(weights):
    """A float32 array's identity by content: its shape and a digest of its
    bytes (a Keras-quantized product's weights are found in the file by
    what they hold, never by name)."""
    weights = np.ascontiguousarray(weights, np.float32)
    return weights.shape, hashlib.blake2b(weights.tobytes(), digest_size=16).digest()


def file_block(keras_block, columns, sizes):
    """The largest of `sizes` that divides both Keras' block (blocks of the
    file lie inside Keras' blocks, the last short one included) and the
    input dimension `columns`; None when none does."""
    group = min(keras_block, columns)
    for size in sorted(sizes, reverse=True):
        if group % size == 0 and columns % size == 0:
            return size
    return None


def keras_int4_blocks(weights, block):
    """Keras' int4 weights (`_compat.keras_quantized.Int4Weights`) in the
    file's blocks of `block`: `(q int8 (out, in), scale float16 (out,
    in // block), zero float32 (out, in // block) or None)`, each file
    block carrying its Keras block's scale (rounded through bfloat16, as
    XNNPACK holds it) and zero point."""
    columns = weights.q.shape[1]
    starts = np.arange(0, columns, block)
    keras_of = starts // weights.block
    scale = _bfloat16_rounded(weights.scale[:, keras_of]).astype(np.float16)
    zero = None if weights.zero is None else weights.zero[:, keras_of]
    return weights.q, scale, zero


def zero_point_products(weights):
    """The products that take Keras' zero points out of a block-wise
    product: `x @ W.T == x @ (q * s).T - (x @ E.T) @ Z.T` with `E` `(blocks,
    in)` one where a column lies in the block, `Z` `(out, blocks)` each
    block's zero point times its (bfloat16-rounded) scale."""
    columns = weights.q.shape[1]
    blocks = weights.zero.shape[1]
    members = np.arange(columns) // weights.block
    indicator = (members[None, :] == np.arange(blocks)[:, None]).astype(np.float32)
    scale = _bfloat16_rounded(weights.scale).astype(np.float16).astype(np.float32)
    return indicator, (weights.zero * scale).astype(np.float32)


# GPTQ's rule for a product calibrated on `rows` inputs of width `cols`
# (`int4_rounding`, and `int8_rounding` alike): rounded to nearest under
# `GPTQ_MIN_ROWS` rows, else GPTQ with its Hessian `x^T x` dampened by
# `GPTQ_DAMP` times its trace over `rows` (the mean of its nonzero
# eigenvalues where `rows < cols`; as a fraction of the mean diagonal,
# `GPTQ_DAMP * cols / rows`), at least 1 % of the mean diagonal. Few rows
# for a wide input leave `x^T x` rank-deficient: GPTQ fits the calibration
# inputs and errs elsewhere; the damping grows as the rows thin, which leans
# the rounding towards the nearest. Measured on SmolLM2-135M-Instruct (133
# calibration rows, inputs of 576 and 1536), each product's error on a
# held-out paragraph: 0.0057 relative mean square at the former fixed 1 % of
# the mean diagonal, 0.0041 at 100 %, 0.0092 rounded to nearest; 0.25 * cols
# / rows puts it near 100 % for inputs of 576 and 290 % for 1536, the best
# of each. A toy model calibrated on 18 rows (inputs of 64 and 128) agreed
# 0.90 with the damping, 0.935 rounded to nearest: under 32 rows, nearest.
GPTQ_DAMP = 0.25
GPTQ_MIN_ROWS = 32


def int4_rounding(weights, x, block_size):
    """`(q, scale, gptq)`: `weights`' int4 blocks, by GPTQ on its inputs
    `x` `(rows, in)` where the rule above takes them (`gptq` True), else
    rounded to nearest (`int4_blocks`)."""
    hessian, damp = _gptq_hessian(x)
    if hessian is None:
        return (*int4_blocks(weights, block_size), False)
    return (*int4_blocks_gptq(weights, hessian, block_size, damp), True)


def int8_rounding(weights, x):
    """`(q, scale, gptq)`: `weights`' symmetric int8 rows, by GPTQ on its
    inputs `x` `(rows, in)` where the rule above takes them, else rounded
    to nearest (`int8_rows`). The scales are `int8_rows`' either way."""
    hessian, damp = _gptq_hessian(x)
    if hessian is None:
        return (*int8_rows(weights), False)
    return (*int8_rows_gptq(weights, hessian, damp), True)


def _gptq_hessian(x):
    """`(x^T x, damping)` by the rule above, or `(None, None)` where the
    rows are too few for GPTQ."""
    rows, cols = x.shape
    if rows < GPTQ_MIN_ROWS:
        return None, None
    x = x.astype(np.float64)
    return x.T @ x, max(0.01, GPTQ_DAMP * cols / rows)


def _inverse_factor(hessian, damp):
    """The upper Cholesky factor of the dampened inverse Hessian: row `j`
    holds how column `j`'s rounding error spreads to the columns after
    it. `damp` (a fraction of the mean diagonal) keeps the inverse bounded
    where an input never varies."""
    h = np.array(hessian, np.float64)
    cols = h.shape[0]
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    h += np.eye(cols) * damp * max(float(np.mean(np.diag(h))), 1e-12)
    return np.linalg.cholesky(np.linalg.inv(h)).T.astype(np.float32)


def _gptq_span(w, q, upper, start, stop, step, low, high):
    """Round columns `start:stop` of `w` (in place) to `q` with `step`
    `(rows,)`, each column's error carried into the span's later columns,
    then the span's errors into every column after it."""
    errors = np.empty((w.shape[0], stop - start), np.float32)
    for j in range(start, stop):
        column = w[:, j]
        rounded = np.clip(np.rint(column / step), low, high)
        q[:, j] = rounded
        error = (column - rounded * step) / upper[j, j]
        w[:, j + 1 : stop] -= np.outer(error, upper[j, j + 1 : stop])
        errors[:, j - start] = error
    w[:, stop:] -= errors @ upper[start:stop, stop:]


def int4_blocks_gptq(weights, hessian, block_size, damp=0.01):
    """Symmetric int4 in blocks of `block_size` along axis 1, as
    `int4_blocks` gives them, with each column's rounding error carried
    into the columns not yet rounded (GPTQ, Frantar et al. 2022,
    arXiv 2210.17323): `hessian` `(in, in)` is the sum of `x x^T` over the
    product's calibration inputs `x`, so the rounding that least changes
    `x @ weights.T` on them is chosen, not the one nearest each weight.

    Each block's scale is chosen (`int4_blocks`' clip search) from the
    block's weights as the errors carried from earlier blocks left them."""
    w = np.array(weights, np.float32)
    rows, cols = w.shape
    upper = _inverse_factor(hessian, damp)
    q = np.empty((rows, cols), np.int8)
    scale = np.empty((rows, cols // block_size), np.float16)
    for b, start in enumerate(range(0, cols, block_size)):
        stop = start + block_size
        _, block_scale = _int4_chunk(w[:, start:stop], block_size)
        scale[:, b] = block_scale[:, 0]
        step = block_scale[:, 0].astype(np.float32)
        _gptq_span(w, q, upper, start, stop, step, -8, 7)
    return q, scale


# Columns rounded between two carries of their errors to the rest of the
# row (GPTQ's lazy batch: the same rounding, fewer passes over the matrix).
GPTQ_SPAN = 128
# Rows of a product's weights `int8_rows_gptq` rounds at a time.
GPTQ_ROWS = 16384


def int8_rows_gptq(weights, hessian, damp=0.01):
    """Symmetric int8 per row with `int8_rows`' scales (`max|w| / 127` of
    each row as given), the columns rounded by GPTQ as in
    `int4_blocks_gptq`; a weight its carried errors push past the range is
    clipped to it."""
    rows, cols = weights.shape
    upper = _inverse_factor(hessian, damp)
    q = np.empty((rows, cols), np.int8)
    scale = np.empty(rows, np.float32)
    # Rows are rounded independently (the errors run along a row), so a
    # table is rounded `GPTQ_ROWS` rows at a time: one float32 chunk held,
    # not a float32 copy of the table (Gemma 3's is 0.67 GB).
    for first in range(0, rows, GPTQ_ROWS):
        w = np.array(weights[first : first + GPTQ_ROWS], np.float32)
        part = q[first : first + GPTQ_ROWS]
        _, step = int8_rows(w)
        for start in range(0, cols, GPTQ_SPAN):
            stop = min(cols, start + GPTQ_SPAN)
            _gptq_span(w, part, upper, start, stop, step, -127, 127)
        scale[first : first + GPTQ_ROWS] = step
    return q, scale
