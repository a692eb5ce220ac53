"""The numeric kernels of the layer-normalized cells and sequence layers.

Each is `keras.ops` only and is chosen for how it differentiates on XLA:CPU
as much as for what it computes; the figures in the docstrings are measured
in docs/recurrent_speed.md. `kerasnorm.recurrent._base` builds the cells and
the time loop from them.
"""

import keras
import numpy as np
from keras import ops

from kerasnorm._core import compute_stats
from kerasnorm._core import normalize
from kerasnorm._core import reshape_target


def layer_norm(x, gamma, beta, epsilon, dtype, *, zero_mean=False):
    """LN over the last axis of `x` with the shared core; output in `dtype`.

    `zero_mean=True` says that `x` already has mean 0 over the last axis (it
    is a product with a `centre_columns` kernel): only the variance is
    computed.
    """
    axes = (len(x.shape) - 1,)
    mean, var = compute_stats(x, axes, use_mean=not zero_mean)
    return normalize(x, mean, var, epsilon=epsilon, scale=gamma, bias=beta, dtype=dtype)


def project(inputs, kernel):
    """`inputs @ kernel` over the last axis, as one 2-D product for inputs of
    any rank (a time step, or every step of a sequence at once).

    The sequence's `(time, batch, features) @ (features, n)` written as a
    rank-3 matmul differentiates on JAX into a `dot_general` whose
    cotangent, the sum of the LN path's and the bias's, XLA:CPU transposes
    element by element before the weight gradient: 51 of the LN-LSTM's 259 ms
    per training step (batch 64, 100 steps, 128 -> 256 units). Reshaped to
    `(time * batch, features)` the same product has no transpose; TensorFlow
    already computes it this way (Keras' `matmul` goes through `tensordot`).
    """
    if len(inputs.shape) == 2:
        return ops.matmul(inputs, kernel)
    rows = ops.reshape(inputs, (-1, inputs.shape[-1]))
    out = ops.matmul(rows, kernel)
    return ops.reshape(out, reshape_target((*ops.shape(inputs)[:-1], kernel.shape[-1])))


def keep_only_matmuls(step):
    """On JAX, `step` differentiated keeping only its matmuls' outputs for the
    backward pass; elsewhere `step` unchanged.

    `lax.scan`'s gradient otherwise stores every intermediate of every time
    step (the LN-LSTM: 20 per step, four of them `(batch, 4 * units)`) and
    reads them back in the backward loop; recomputing the elementwise part
    from the saved matmul instead is cheaper on a CPU. Same values.
    TensorFlow's while loop has no such policy. Measured in
    docs/recurrent_speed.md.
    """
    if keras.backend.backend() != "jax":
        return step
    import jax

    return jax.checkpoint(step, policy=jax.checkpoint_policies.dots_saveable)


def sequence_layer_norm(x, gamma, beta, epsilon, dtype, sizes):
    """`layer_norm(..., zero_mean=True)` of the hoisted `(time, batch, n)`
    projection, over each group of `sizes` columns, with the gains applied
    through a matmul.

    The per-row reciprocal std of each group times the gains is the product
    `rsqrt(var + eps) @ gains` of the `(time, batch, groups)` statistics
    with a `(groups, n)` matrix holding each group's gains in its columns, so
    the gains' gradient is a matmul contracting over the batch rows (one per
    time step, summed), and the bias is added once over all groups. Written as
    broadcast products per group, their gradients are multiply-and-reduce
    kernels over the leading axes, which XLA:CPU emits as slow column
    reductions (44 of the LN-LSTM's 557 ms per training step on one thread,
    docs/recurrent_speed.md); the matmul takes a fraction of that. The
    values are the same products.
    """
    last = len(x.shape) - 1
    bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
    parts = ops.split(x, bounds, axis=last) if bounds else [x]
    var = ops.concatenate(
        [compute_stats(p, (last,), use_mean=False)[1] for p in parts], axis=last
    )
    inv = ops.rsqrt(var + epsilon)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    one_hot = (np.arange(len(sizes))[:, None] == groups[None, :]).astype("float32")
    gains = ops.convert_to_tensor(one_hot, inv.dtype) * ops.cast(gamma, inv.dtype)
    # `(time, batch, groups) @ (1, groups, n)`: one product per time step,
    # so the gains' gradient is `time` products, not the one matrix-vector
    # product over every row that XLA:CPU fuses into a slow strided loop
    # (docs/recurrent_speed.md, "LN_x's gain gradient per time step", has
    # the figures). The values are the same products.
    y = ops.cast(x, inv.dtype) * ops.matmul(inv, gains[None]) + ops.cast(
        beta, inv.dtype
    )
    return ops.cast(y, dtype)


def centre_columns(kernel, sizes):
    """`kernel` minus, in each row, its mean over each group of columns.

    Then `x @ centre_columns(kernel, sizes)` equals `x @ kernel` centred
    within each group, exactly (the mean over a group of `x @ k` is `x` times
    the row means of `k`). LN's mean subtraction thereby moves from every
    time step's activations to the kernel, once per call and outside the time
    loop, and drops out of the loop's backward pass too.
    """
    if len(sizes) == 1:
        return kernel - ops.mean(kernel, axis=1, keepdims=True)
    bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
    parts = ops.split(kernel, bounds, axis=1)
    return ops.concatenate(
        [p - ops.mean(p, axis=1, keepdims=True) for p in parts], axis=1
    )
