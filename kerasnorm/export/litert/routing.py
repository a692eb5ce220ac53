"""A mixture of experts' routing in ops XNNPACK delegates, while a float32
file of a keras-hub decoder is traced (`lowering.decoder_graph`).

keras-hub's sparse blocks (Mixtral, Qwen-MoE, Qwen3-MoE, GPT-OSS, Gemma 4)
evaluate every expert and weight the outputs by a dense routing matrix,
built from the router's scores as `top_k`, then `one_hot` of the chosen
indices (and Gemma 4's `take_along_axis` of the probabilities at them).
`TOPK_V2`, `ONE_HOT`, `GATHER` and the integer arithmetic around them run
outside XNNPACK, which splits the decode step's partition at every
layer. Here the same selection is written in float arithmetic of the
scores alone:

- **Each expert's rank** among the `E` scores `x`, in the order
  `tf.math.top_k` gives (larger first, the lower index first among equal
  scores): `rank_i = #{j > i: x_j > x_i} + #{j < i: x_j >= x_i}`, from the
  pairwise differences' signs. `[d > 0]` is `min(relu(d) * 2**126, 1)`
  applied twice (the second pass takes a subnormal difference to 1): 0 or
  1 exactly, since the difference of two distinct finite floats is never
  0 (where the processor flushes subnormals to zero, as TensorFlow's CPU
  kernels do, two scores that differ by less than the smallest normal
  float compare equal, as in TensorFlow's own `top_k` there). The counts
  are exact integers in float32.
- **`one_hot(indices)`** is then `relu(1 - |rank - s|)` for the slots
  `s < k`: 1.0 where the expert holds slot `s`, else 0.0, exactly.
- **The chosen scores** (`top_k`'s values, `take_along_axis`) are the sum
  of each one-hot row times the scores: one term is the score itself, the
  rest `0 * x = 0`, so equal to the bit for finite scores.

`top_k` still returns its integer indices (`tf.math.top_k`'s): the
`one_hot` and `take_along_axis` of them read the float rows instead, and
the converter drops the `TOPK_V2` nothing else reads. Applied only inside a
keras-hub layer, to float32 scores over at most `MAX_EXPERTS` experts:
the routers' scores are finite (a softmax's probabilities or a projection's
logits), where a sampler's masked `-inf` logits would make the differences
NaN; the `[T, E, E]` comparison stays small. The cost is a few elementwise
ops on `E * E` values per token, beside the experts' products.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import tensorflow as tf

from kerasnorm._compat import backend_numpy_replaced
from kerasnorm._compat import backend_replaced
from kerasnorm._compat import calling_layers

MAX_EXPERTS = 256
_SCALE = 2.0**126


@contextlib.contextmanager
def routing_as_arithmetic():
    """While active, keras-hub's routers select their experts in the float
    ops above (a float32 file only: the int8 quantizers calibrate the usual
    graph)."""
    rows = {}  # an index tensor's ref -> its one-hot rows, float32
    with (
        backend_replaced("math", top_k=functools.partial(_top_k, rows)),
        backend_replaced("nn", one_hot=functools.partial(_one_hot, rows)),
        backend_numpy_replaced(
            take_along_axis=functools.partial(_take_along_axis, rows)
        ),
    ):
        yield


def _top_k(rows, original, x, k, sorted=True):
    scores = tf.convert_to_tensor(x)
    experts = scores.shape[-1] if scores.shape.rank else None
    if (
        scores.dtype != tf.float32
        or experts is None
        or not isinstance(k, (int, np.integer))
        or not 1 <= k <= experts <= MAX_EXPERTS
        or not _in_hub_layer()
    ):
        return original(x, k, sorted)
    chosen = _one_hot_rows(scores, int(k))
    values = _picked(chosen, scores)
    indices = original(x, k, sorted)[1]
    rows[indices.ref()] = chosen
    return values, indices


def _one_hot(rows, original, x, num_classes, axis=-1, dtype=None, sparse=False):
    chosen = _rows_of(rows, x)
    rank = None if chosen is None else chosen.shape.rank
    if (
        chosen is None
        or sparse
        or axis not in (-1, rank - 1)
        or chosen.shape[-1] != num_classes
        or tf.as_dtype(dtype or "float32") != tf.float32
    ):
        return original(x, num_classes, axis=axis, dtype=dtype, sparse=sparse)
    return chosen


def _take_along_axis(rows, original, x, indices, axis=None):
    chosen = _rows_of(rows, indices)
    scores = tf.convert_to_tensor(x)
    if (
        chosen is None
        or axis not in (-1, chosen.shape.rank - 2)
        or scores.dtype != tf.float32
        or scores.shape.rank != chosen.shape.rank - 1
        or scores.shape[-1] != chosen.shape[-1]
    ):
        return original(x, indices, axis=axis)
    return _picked(chosen, scores)


def _rows_of(rows, indices):
    if not isinstance(indices, tf.Tensor):
        return None
    return rows.get(indices.ref())


def _one_hot_rows(scores, k):
    """`[..., k, E]`: row `s` is 1.0 at the expert `tf.math.top_k(scores,
    k)` puts at slot `s`, 0.0 elsewhere."""
    experts = scores.shape[-1]
    # above[..., i, j] = [x_j > x_i], kept where j > i: summed along a row,
    # the higher experts j > i that beat expert i; down column i, the
    # lower experts j < i that expert i beats, which leaves i minus those
    # of its i lower experts that score at least as high.
    above = _positive(scores[..., None, :] - scores[..., :, None])
    upper = np.triu(np.ones((experts, experts), "float32"), 1)
    kept = above * tf.constant(upper)
    index = tf.constant(np.arange(experts, dtype="float32"))
    rank = tf.reduce_sum(kept, -1) + index - tf.reduce_sum(kept, -2)
    slots = tf.constant(np.arange(k, dtype="float32")[:, None])
    return tf.nn.relu(1.0 - tf.abs(rank[..., None, :] - slots))


def _positive(d):
    """1.0 where `d > 0`, else 0.0 (`d` finite or infinite, not NaN)."""
    once = tf.minimum(tf.nn.relu(d) * _SCALE, 1.0)
    return tf.minimum(once * _SCALE, 1.0)


def _picked(chosen, scores):
    """Each one-hot row's score: `[..., k]`."""
    return tf.reduce_sum(chosen * scores[..., None, :], -1)


def _in_hub_layer():
    """Whether the innermost layer being called is a keras-hub layer (a
    router of finite scores)."""
    layers = calling_layers()
    return bool(layers) and type(layers[-1]).__module__.startswith("keras_hub.")
