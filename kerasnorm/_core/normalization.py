"""The one normalization core every kerasnorm normalizer is built on.

Every normalizer is two steps over a set of reduction axes R (docs/design.md,
Core):

    mean = E_R[x]                       (0 for RMS-type norms)
    var  = E_R[(x - mean) ** 2]         (two-pass: centre first, then square)
    y    = (x - mean) * rsqrt(var + eps) * gamma + beta

`compute_stats` does the first step and `normalize` the second. Layers only
choose the axes, the flags and the parameter shapes. Everything is written with
`keras.ops`, so the math does not depend on the Keras base class a layer uses.
"""

from keras import backend
from keras import ops


def stats_dtype(dtype):
    """The dtype statistics are computed in: at least float32.

    float16 squares overflow at |x| > 256, bfloat16 sums lose digits fast; both
    are promoted. float64 stays float64.
    """
    return "float64" if backend.standardize_dtype(dtype) == "float64" else "float32"


def compute_stats(x, axes, *, use_mean=True, mask=None):
    """Mean and variance of `x` over `axes`, in at least float32, keepdims.

    Args:
        x: input tensor, any float dtype.
        axes: tuple of non-negative axes to reduce over.
        use_mean: if False the mean is taken as 0 (RMS-type norms): the
            returned `mean` is None and `var` is E[x^2].
        mask: optional boolean tensor broadcastable to `x`; entries where it
            is False do not count towards the statistics, whatever they hold
            (NaN and inf included), in the values and in the gradients.
            Positions where every entry is masked get mean 0 and var 0.

    Returns:
        `(mean, var)` with the reduced axes kept as size 1.
    """
    x = ops.cast(x, stats_dtype(x.dtype))
    if mask is None:
        mean = ops.mean(x, axis=axes, keepdims=True) if use_mean else None
        var = ops.mean(ops.square(_centre(x, mean)), axis=axes, keepdims=True)
        return mean, var

    mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(x))
    zero = ops.zeros((), x.dtype)
    # `where`, never a product with the mask: padding may hold NaN or inf and
    # nan * 0 is NaN. Replacing the padded entries before any arithmetic also
    # keeps NaN out of the gradient, which a `where` on a result would not.
    x = ops.where(mask, x, zero)
    count = ops.sum(ops.cast(mask, x.dtype), axis=axes, keepdims=True)
    count = ops.maximum(count, 1.0)
    mean = ops.sum(x, axis=axes, keepdims=True) / count if use_mean else None
    squares = ops.where(mask, ops.square(_centre(x, mean)), zero)
    return mean, ops.sum(squares, axis=axes, keepdims=True) / count


def _centre(x, mean):
    """x - mean for the variance, with the gradient through `mean` cut.

    That gradient is exactly zero (the centred values sum to zero over the
    reduced axes), so cutting it changes nothing but the work: XLA no longer
    builds the backward pass of a second reduction.
    """
    return x if mean is None else x - ops.stop_gradient(mean)


def normalize(
    x, mean, var, *, epsilon, scale=None, bias=None, dtype=None, mean_in_shift=False
):
    """`(x - mean) * rsqrt(var + epsilon) * scale + bias`, cast to `dtype`.

    The arithmetic runs in the statistics' dtype (at least float32); `scale`
    and `bias` must already broadcast against `x`. `dtype` defaults to the
    dtype of `x`.

    With `mean_in_shift=True` the mean is folded into the shift instead:
    `x * m + (bias - mean * m)` with `m = rsqrt(var + eps) * scale`, one
    multiply-add per element on coefficients of the statistics' shape. XLA
    fuses that form much better when the statistics broadcast over inner axes
    (GroupNorm, InstanceNorm: ~1.4x faster forward+backward on CPU), at the
    cost of an absolute error of about |mean| / std * 2^-23 (1e-3 at
    |mean| / std = 1e4, inside the 1e-2 the core guarantees).
    """
    out_dtype = dtype or x.dtype
    compute = var.dtype
    x = ops.cast(x, compute)
    inv = ops.rsqrt(var + epsilon)
    scale = None if scale is None else ops.cast(scale, compute)
    bias = None if bias is None else ops.cast(bias, compute)
    # The gain is folded into the reciprocal std when their product is
    # smaller than `x` (GroupNorm, InstanceNorm: it broadcasts over the
    # spatial axes), so it multiplies few values instead of every element.
    # When the product is as large as `x` (LayerNorm and RMSNorm over the
    # axes the gain spans), the folded form only adds work: JAX's gradient
    # of it runs 1.15x (LayerNorm) to 1.8x (RMSNorm) slower on XLA:CPU.
    fold = scale is not None and (
        mean_in_shift or _smaller_than(x.shape, var.shape, scale.shape)
    )
    mul = inv * scale if fold else inv
    if not mean_in_shift or mean is None:
        y = (x if mean is None else x - mean) * mul
        if scale is not None and not fold:
            y = y * scale
        if bias is not None:
            y = y + bias
    else:
        shift = -mean * mul
        y = x * mul + (shift if bias is None else shift + bias)
    return ops.cast(y, out_dtype)


def _smaller_than(x_shape, *shapes):
    """Whether the broadcast of `shapes` leaves out a non-trivial axis of
    `x_shape` (so it holds fewer elements than `x`). Unknown sizes count as
    non-trivial."""
    rank = len(x_shape)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    for i, size in enumerate(x_shape):
        if size != 1 and all(p[i] == 1 for p in padded):
            return True
    return False


def normalize_axes(axis, rank, *, arg_name="axis"):
    """Resolve `axis` (int or sequence of ints) to sorted non-negative axes.

    Raises ValueError naming `arg_name` for an axis out of bounds for `rank`
    or a repeated axis.
    """
    raw = [axis] if isinstance(axis, int) else list(axis)
    resolved = []
    for a in raw:
        if not -rank <= a < rank:
            raise ValueError(
                f"Invalid `{arg_name}`: axis {a} is out of bounds for an input "
                f"of rank {rank}. Received: {arg_name}={axis}"
            )
        resolved.append(a % rank)
    if len(set(resolved)) != len(resolved):
        raise ValueError(
            f"Duplicate axes in `{arg_name}` for an input of rank {rank}. "
            f"Received: {arg_name}={axis}"
        )
    return tuple(sorted(resolved))


def broadcast_shape(rank, axes, sizes):
    """Shape that places per-axis parameters of `sizes` along `axes`."""
    shape = [1] * rank
    for a, n in zip(axes, sizes, strict=True):
        shape[a] = n
    return tuple(shape)
