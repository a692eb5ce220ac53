"""The norms' float32 `.tflite` graph: the same function in the ops XNNPACK
runs fastest (docs/norm_speed.md, float32 files).

The TFLite writer traces a float32 file inside `float32_tflite()`; there the
layers write their inference math this way, and everywhere else (training,
XLA, the other backends, the int8 / float16 / dynamic files, whose
quantizers look for the usual statistics ops) as the core writes it:

- **GroupNorm, channels last.** The statistics are taken per channel over
  the spatial axes (a `MEAN` over axes 1 .. rank-2 of the input itself),
  then averaged over each group's channels by a product with a constant
  block matrix (a `FULLY_CONNECTED` on `(batch, 1, .., 1, C)`). The usual
  graph reshapes the input to `(batch, spatial, groups, C / groups)` and
  reduces two of its axes: a reshape and a reduction XNNPACK runs slower
  than the convolutions around them. Equal-sized groups make the two means
  equal; the variance is of the centred values, as in the core.
- **LayerNorm and RMSNorm over the last axis of a rank-4 input, with a gain
  and an offset.** The two are one `DEPTHWISE_CONV_2D` with a 1 x 1 kernel
  (the gain) and its bias (the offset), one pass over the tensor where
  `* gamma + beta` takes two. A gain alone stays a `MUL`: the depthwise op
  saves no pass then, and XNNPACK runs it slower than the multiply from 32
  channels on (docs/norm_speed.md, sixth round).

Before tracing, the export's fold removes the affine altogether where the
next layer can take it (`kerasnorm.export.fold.affine`: an RMSNorm's gain
through a ReLU into the next `Conv2D`, say); the norm then traces with
neither gain nor offset.

The fast int8 file (`int8_tflite()`) takes GroupNorm's statistics the same
way, the statistics and the normalization `(x - mean) * rsqrt(var + eps)`
in float (`tflite.selective` finds them through the block product) and the
affine as the core writes it, int8 between the int8 convolutions. Through
the core's grouped view the statistics were a reshape and a two-axis
reduction in float between int8 convolutions: that file ran slower than
the float32 one (docs/norm_speed.md, eighth round).

Every `.tflite` trace, whatever its mode, also writes a `Dense` on tokens
as one `FULLY_CONNECTED` (`kerasnorm._compat.matmul_as_one_product`, held
by the TFLite writer: the hook is into Keras' TensorFlow backend, which
this backend-neutral module does not import).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from keras import backend
from keras import ops

# The file being traced: "float32", "int8" (the fast int8 file's float32
# graph, before `quantize_selectively`) or None (every other trace).
_ACTIVE = contextvars.ContextVar("kerasnorm_tflite_lowering", default=None)


@contextlib.contextmanager
def _tracing(kind):
    token = _ACTIVE.set(kind)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def float32_tflite():
    """While active, the norms trace their float32 `.tflite` graph."""
    return _tracing("float32")


def int8_tflite():
    """While active, the norms trace the fast int8 file's graph: GroupNorm's
    statistics in channel space (which the selective quantizer keeps in
    float), the rest as the core writes it."""
    return _tracing("int8")


def active():
    """Whether a float32 `.tflite` file is being traced."""
    return _ACTIVE.get() == "float32"


def centres_first():
    """Whether the fast int8 file is traced: there the norms whose mean
    otherwise goes into the shift (`normalize(mean_in_shift=True)`:
    InstanceNorm, GroupNorm) centre first, `(x - mean) * m + beta`. The
    shift form `x * m + (beta - mean * m)` subtracts two large quantized
    products where a channel's spread is small against its mean (token
    embeddings over time): their int8 rounding is then most of the output
    (fuzzed graphs, docs/design.md section 13)."""
    return _ACTIVE.get() == "int8"


def channel_stats():
    """Whether GroupNorm takes its statistics in channel space
    (`channel_group_stats`): a float32 or a fast int8 file is traced."""
    return _ACTIVE.get() is not None


def lowers_affine(x, scale, bias):
    """Whether a float32 file is traced and `x * scale + bias` is a 1 x 1
    depthwise convolution: a rank-4 `x` and a per-channel `scale` and `bias`
    over its last axis, each `(C,)` or `(1, 1, 1, C)`."""
    if not active() or scale is None or bias is None or len(x.shape) != 4:
        return False
    channels = x.shape[-1]
    return channels is not None and all(
        tuple(param.shape)[-1:] == (channels,)
        and all(size == 1 for size in tuple(param.shape)[:-1])
        for param in (scale, bias)
        if param is not None
    )


def depthwise_affine(x, scale, bias):
    """`x * scale + bias` as a 1 x 1 depthwise convolution and its bias,
    where `lowers_affine` says so."""
    channels = x.shape[-1]
    kernel = ops.reshape(scale, (1, 1, channels, 1))
    y = ops.depthwise_conv(x, kernel, 1, "valid", data_format="channels_last")
    return y + ops.reshape(bias, (channels,))


def channel_group_stats(x, groups):
    """`(centred, var)` of channels-last `x` (rank >= 3, its channels
    static): `x` less its group's mean, and each channel's group variance
    shaped `(batch, 1, .., 1, C)`. Each is a spatial `MEAN` per channel,
    then a product with the block matrix that averages each group's
    channels. In `x`'s dtype (at least float32: the caller has cast it)."""
    channels = x.shape[-1]
    spatial = tuple(range(1, len(x.shape) - 1))
    size = channels // groups
    average = None
    if size > 1:
        block = np.kron(np.eye(groups), np.full((size, size), 1.0 / size))
        average = ops.convert_to_tensor(block, dtype=backend.standardize_dtype(x.dtype))

    def group_mean(values):
        if average is None:
            return ops.mean(values, axis=spatial, keepdims=True)
        # The product on (batch, C): a rank-2 FULLY_CONNECTED, which needs
        # no shape arithmetic at a dynamic batch (a rank-4 one does).
        mean = ops.matmul(ops.mean(values, axis=spatial), average)
        return ops.reshape(mean, (-1, *(1 for _ in spatial), channels))

    centred = x - group_mean(x)
    return centred, group_mean(centred * centred)
