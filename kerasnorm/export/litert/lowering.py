"""Decoder language models (keras-hub's Gemma, Gemma3, Llama, Mistral,
Qwen3, Phi3, GPT-2) traced in TFLite builtins, and in the ops XNNPACK
delegates: the same functions written in other TensorFlow ops, while a
`.tflite` file is traced (docs/guides/export.md, "keras-hub decoders").

`decoder_graph(float_file)` holds, while a model is traced into a
`tf.function`:

- **New axes as `EXPAND_DIMS`** (`_compat.new_axes_as_expand_dims`): an
  attention mask's `mask[:, None, :, :]` is a `StridedSlice` with a new
  axis, which the converter writes as a builtin only at a fully static
  shape; at an open length it needs the Flex runtime.
- **A step along one axis as reshapes** (`_compat.strided_slices_as_reshapes`):
  GPT-OSS's experts read their interleaved gate and up halves as
  `x[..., ::2]` and `x[..., 1::2]`, a `STRIDED_SLICE` with strides, which
  XNNPACK does not delegate; the axis reshaped to `(size // 2, 2)` and one
  column sliced is the same tensor.
- **`keras.ops.stack` as `CONCATENATION`** of the operands with their new
  axis: the rotary embedding's rotate-half (`stack((-x2, x1), -2)`) and
  Gemma's interleave write `PACK`, which XNNPACK does not delegate.
- **`keras.ops.repeat` of a float tensor as one broadcasting `MUL`** by
  ones, then a reshape: grouped-query attention repeats each key/value
  head, which TensorFlow writes as `TILE`, not delegated either.
- **`keras.ops.where` with one constant branch as arithmetic**, in a float
  file only, inside a Keras `Softmax` or a keras-hub layer: `where(mask,
  x, k)` is `x * m + k * (1 - m)` with `m` the mask as 0.0 / 1.0, and
  `k * (1 - m)` the additive bias of the mask. For a finite `x` the two
  are equal to the bit (`x * 1 + 0`, `x * 0 + k`); the softmax's masks and
  Gemma's wipe of unattended rows are this case. Elsewhere a selection may
  guard a non-finite branch (`where(x > 0, log(x), 0)`), and stays one.
  XNNPACK has no `SELECT`, and the mask's cast and bias depend on the mask
  alone, which the converter computes once before the first layer.
- **A mixture of experts' routing as arithmetic**, in a float file only
  (`routing.routing_as_arithmetic`): keras-hub's routers' `top_k`, and the
  `one_hot` and `take_along_axis` of its indices, as float ops of the
  router's scores, equal to the bit for finite scores, with `top_k`'s
  order among equal ones. XNNPACK has no `TOPK_V2`, `ONE_HOT` or `GATHER`.

Each applies inside any trace (the KV-cache step's too): the `with` must
surround the tracing, not the call of the traced function.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

from kerasnorm._compat import backend_numpy_replaced
from kerasnorm._compat import calling_layers
from kerasnorm._compat import new_axes_as_expand_dims
from kerasnorm._compat import strided_slices_as_reshapes
from kerasnorm.export.litert.routing import routing_as_arithmetic


@contextlib.contextmanager
def decoder_graph(float_file=True):
    """While active, the ops above trace in builtins XNNPACK delegates; the
    selection and the routing as arithmetic only with `float_file` (a
    float32 file: the int8 quantizers calibrate the usual graph)."""
    routing = routing_as_arithmetic() if float_file else contextlib.nullcontext()
    with (
        new_axes_as_expand_dims(),
        strided_slices_as_reshapes(),
        backend_numpy_replaced(
            stack=_stack, repeat=_repeat, where=_where if float_file else None
        ),
        routing,
    ):
        yield


def _stack(original, x, axis=0):
    tensors = [tf.convert_to_tensor(t) for t in x]
    rank = tensors[0].shape.rank if tensors else None
    if rank is None or len(tensors) < 2 or not -(rank + 1) <= axis <= rank:
        return original(x, axis=axis)
    axis = axis % (rank + 1)
    return tf.concat([tf.expand_dims(t, axis) for t in tensors], axis)


def _repeat(original, x, repeats, axis=None):
    x = tf.convert_to_tensor(x)
    rank = x.shape.rank
    plain = isinstance(repeats, (int, np.integer)) and not isinstance(repeats, bool)
    if (
        not plain
        or repeats < 2
        or axis is None
        or rank is None
        or not x.dtype.is_floating
        or not -rank <= axis < rank
    ):
        return original(x, repeats, axis=axis)
    axis = axis % rank
    repeats = int(repeats)
    ones = np.ones((1,) * (axis + 1) + (repeats,) + (1,) * (rank - axis - 1))
    copies = tf.expand_dims(x, axis + 1) * tf.constant(ones, x.dtype)
    return tf.reshape(copies, _merged_shape(x, axis, repeats))


def _merged_shape(x, axis, repeats):
    """`x`'s shape with `axis` `repeats` times longer: Python ints where
    they are static, and -1 for the one dynamic dimension where there is
    only one; otherwise a shape computed at run time."""
    static = x.shape.as_list()
    if static[axis] is not None:
        static[axis] *= repeats
    if sum(size is None for size in static) <= 1:
        return [-1 if size is None else size for size in static]
    dynamic = tf.unstack(tf.shape(x))
    sizes = [dynamic[i] if size is None else size for i, size in enumerate(static)]
    if static[axis] is None:
        sizes[axis] = dynamic[axis] * repeats
    return tf.stack(sizes)


def _where(original, condition, x1=None, x2=None):
    if x1 is None or x2 is None or not _masking():
        return original(condition, x1, x2)
    condition = tf.convert_to_tensor(condition)
    if condition.dtype != tf.bool:
        return original(condition, x1, x2)
    first, second = _constant(x1), _constant(x2)
    if (first is None) == (second is None):
        return original(condition, x1, x2)
    values = tf.convert_to_tensor(x2 if first is not None else x1)
    constant = first if first is not None else second
    if not values.dtype.is_floating or not np.isfinite(constant):
        return original(condition, x1, x2)
    kept = tf.cast(condition, values.dtype)
    if first is not None:  # where(mask, k, x): x where the mask is False
        kept = 1.0 - kept
    out = values * kept
    if constant != 0:
        out = out + tf.constant(constant, values.dtype) * (1.0 - kept)
    return out


def _masking():
    """Whether the innermost layer being called is a Keras `Softmax` (its
    masks) or a keras-hub layer (attention masks): selections of finite
    values. Elsewhere a selection may guard a non-finite branch
    (`where(x > 0, log(x), 0)`), which the arithmetic would turn into NaN."""
    layers = calling_layers()
    if not layers:
        return False
    layer = layers[-1]
    return isinstance(layer, keras.layers.Softmax) or type(layer).__module__.startswith(
        "keras_hub."
    )


def _constant(x):
    """The one value of `x` where it is a Python number, a constant or
    `zeros_like` tensor of one value; else None."""
    if isinstance(x, (int, float, np.number)) and not isinstance(x, bool):
        return float(x)
    if not isinstance(x, (tf.Tensor, np.ndarray)):
        return None
    if isinstance(x, tf.Tensor) and not tf.executing_eagerly():
        if x.op.type == "ZerosLike":
            return 0.0
    value = tf.get_static_value(x) if isinstance(x, tf.Tensor) else x
    if value is None or np.size(value) == 0:
        return None
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.number) or np.any(value != value.flat[0]):
        return None
    return float(value.flat[0])
