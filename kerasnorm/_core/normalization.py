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

from kerasnorm._core import lowering


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
        var = ops.mean(_squares(x, mean), axis=axes, keepdims=True)
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
    squares = ops.where(mask, _squares(x, mean), zero)
    return mean, ops.sum(squares, axis=axes, keepdims=True) / count


def _squares(x, mean):
    """`(x - mean) ** 2` (`x ** 2` without a mean), written as a product of
    the centred values with themselves.

    XLA compiles either form to the same multiply. The TFLite converter
    fuses `square(x - mean)` into `SQUARED_DIFFERENCE`, which XNNPACK runs
    slower than the `SUB` (the centred values, needed anyway) and a `MUL`:
    float32 `.tflite` files with LayerNorm run 5-13 % faster
    (docs/norm_speed.md, float32 files). Without a mean `SQUARE` and `MUL`
    run alike, and `SQUARE` stays.
    """
    if mean is None:
        return ops.square(x)
    centred = _centre(x, mean)
    return centred * centred


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
    # A float32 .tflite file writes a gain that multiplies every element, and
    # the offset, as one op (`lowering.py`).
    depthwise = (
        not fold and not mean_in_shift and lowering.lowers_affine(x, scale, bias)
    )
    trailing = (
        None
        if fold or mean_in_shift or depthwise
        else _trailing_axes(x, var, scale, bias)
    )
    if trailing:
        return ops.cast(
            _normalize_trailing(x, mean, var, scale, bias, epsilon, trailing),
            out_dtype,
        )
    inv = ops.rsqrt(var + epsilon)
    mul = inv * scale if fold else inv
    if not mean_in_shift or mean is None:
        y = (x if mean is None else x - mean) * mul
        if depthwise:
            return ops.cast(lowering.depthwise_affine(y, scale, bias), out_dtype)
        if scale is not None and not fold:
            y = y * scale
        if bias is not None:
            y = y + bias
    else:
        shift = -mean * mul
        y = x * mul + (shift if bias is None else shift + bias)
    return ops.cast(y, out_dtype)


# The backends whose `ops.custom_gradient` works (Keras implements it for
# TensorFlow and JAX only).
_CUSTOM_GRADIENT_BACKENDS = ("tensorflow", "jax")


def _trailing_axes(x, var, scale, bias):
    """k when the statistics reduce the last k axes of `x` and `scale` and
    `bias` (where given) span exactly those axes, else None.

    That layout (LayerNorm, RMSNorm over their parameter axes; the LN-RNN
    gates) is the one `_normalize_trailing` writes the gradient for.
    """
    if backend.backend() not in _CUSTOM_GRADIENT_BACKENDS:
        return None
    rank = len(x.shape)
    var_shape = tuple(var.shape)
    if len(var_shape) != rank:
        return None
    k = 0
    while k < rank - 1 and var_shape[rank - 1 - k] == 1:
        k += 1
    if k == 0 or any(size == 1 for size in var_shape[: rank - k]):
        # A size-1 leading statistic axis may be a reduced one as well.
        return None
    sizes = tuple(x.shape[rank - k :])
    if any(size is None for size in sizes):
        return None
    for param in (scale, bias):
        if param is None:
            continue
        shape = tuple(param.shape)
        lead = shape[: len(shape) - k]
        if (
            len(shape) < k
            or shape[len(shape) - k :] != sizes
            or any(size != 1 for size in lead)
        ):
            return None
    return k


def _normalize_trailing(x, mean, var, scale, bias, epsilon, k):
    """`(x - mean) * rsqrt(var + epsilon) * scale + bias` over the last `k`
    axes, with its gradient written out (docs/norm_speed.md).

    What autodiff builds for this expression is right but slow on XLA:CPU,
    which does not fuse an elementwise producer into a reduction: every row
    or column sum of a product is a full-size tensor written and read back.
    The gradient here needs two such products fewer. The row sums it needs
    are `sum(dy * scale)` and `sum(dy * xhat * scale)`; both are products
    with `scale` along the reduced axes, which a matrix-vector product reads
    straight from `dy` and from `dy * xhat`, the tensor the gain's gradient
    sums over the other axes anyway.

    Gradients are returned for `mean` and `var` too, so autodiff carries
    them through `compute_stats` as before (the terms it adds are
    elementwise and fuse into the one kernel that writes dx). Everything the
    gradient uses is recomputed from the inputs, so second-order gradients
    through it are exact; XLA merges the recomputation with the forward
    pass.
    """
    rank = len(x.shape)
    reduced = tuple(range(rank - k, rank))
    outer = tuple(range(rank - k))
    present = [t is not None for t in (mean, scale, bias)]

    def unpack(args):
        args = list(args)
        x, var = args.pop(0), args.pop(0)
        mean, scale, bias = (args.pop(0) if p else None for p in present)
        return x, mean, var, scale, bias

    @ops.custom_gradient
    def fn(*args):
        x, mean, var, scale, bias = unpack(args)
        y = (x if mean is None else x - mean) * ops.rsqrt(var + epsilon)
        if scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias

        def grad(*args, upstream=None):
            dy = args[0] if upstream is None else upstream
            return _normalize_trailing_grad(
                dy, x, mean, var, scale, bias, epsilon, reduced, outer
            )

        return y, grad

    args = [x, var] + [t for t in (mean, scale, bias) if t is not None]
    return fn(*args)


def _normalize_trailing_grad(dy, x, mean, var, scale, bias, epsilon, reduced, outer):
    """Gradients of `_normalize_trailing` for (x, var, mean, scale, bias),
    those of absent inputs left out.

    With `g = dy * scale` and `xhat = (x - mean) * rstd`:
    dx = g * rstd, dmean = -rstd * sum(g), dvar = -rstd^2 / 2 * sum(g * xhat),
    dscale = sum_outer(dy * xhat), dbias = sum_outer(dy).
    """
    k = len(reduced)
    rstd = ops.rsqrt(var + epsilon)
    xhat = (x if mean is None else x - mean) * rstd
    if scale is None:
        g = dy
        sum_g = ops.sum(dy, axis=reduced, keepdims=True)
        sum_gx = ops.sum(dy * xhat, axis=reduced, keepdims=True)
        dscale = None
    else:
        vector = ops.reshape(scale, tuple(x.shape[len(x.shape) - k :]))
        g = dy * scale
        p = dy * xhat
        sum_g = _expand(ops.tensordot(dy, vector, axes=k), k)
        sum_gx = _expand(ops.tensordot(p, vector, axes=k), k)
        dscale = ops.reshape(ops.sum(p, axis=outer), ops.shape(scale))
    grads = [g * rstd, -0.5 * ops.square(rstd) * sum_gx]
    if mean is not None:
        grads.append(-rstd * sum_g)
    if scale is not None:
        grads.append(dscale)
    if bias is not None:
        grads.append(ops.reshape(ops.sum(dy, axis=outer), ops.shape(bias)))
    return tuple(grads)


def _expand(t, k):
    """`t` with `k` trailing size-1 axes (keepdims for a tensordot)."""
    for _ in range(k):
        t = ops.expand_dims(t, -1)
    return t


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


def reshape_target(dims):
    """`dims` (ints, or scalar tensors where a size is known only at run
    time) as a reshape target: its one run-time entry, where there is
    exactly one (the batch of a model exported with a dynamic batch), is
    written -1, so the traced graph holds no shape arithmetic: a `.tflite`
    file would otherwise run `SHAPE`/`STRIDED_SLICE`/`PACK` outside XNNPACK.
    """
    dims = tuple(dims)
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(unknown) != 1:
        return dims
    return tuple(-1 if i == unknown[0] else d for i, d in enumerate(dims))


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
