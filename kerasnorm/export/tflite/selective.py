"""int8 files that XNNPACK runs as one partition: the few ops it has no
int8 kernel for stay in float inside the file.

A plain full-integer file of a normalized model is slower than its float32
file on LiteRT's CPU delegate: XNNPACK has no int8 `SQUARED_DIFFERENCE`,
`RSQRT`, `BATCH_MATMUL`, `SOFTMAX` or `GELU`, and takes no int8 `ADD` of a
scalar constant (a norm's epsilon), so each norm and each attention splits
the graph into partitions with reference kernels between them; its int8
`MEAN` over several axes (GroupNorm's groups) is slower than the float one.
XNNPACK does take those ops in float, and `QUANTIZE`/`DEQUANTIZE` between
int8 and float inside one partition; so the file quantizes everything else
and keeps

- each norm's statistics: the chain from the inverse square root back to
  the reduction of the squares (`SQUARED_DIFFERENCE`/`SQUARE`, `MEAN`, the
  epsilon `ADD`, `RSQRT`), found in the float file's graph, and its
  normalization, (x - mean) times that root; the affine stays int8;
- each attention's scores, from the `BATCH_MATMUL` to the `SOFTMAX` (the
  key-dim scale, a mask's fill), and its queries and keys from their
  projections to that matmul: `float_nodes` says why;
- the op types in `FLOAT_OPS`, wherever they are;
- the int8 `ADD`/`SUB`/`MUL` ops whose scales XNNPACK's int8 kernels refuse
  (`xnnpack_refused`; a trained norm's small `beta` added to a wide
  tensor), found in the quantized file and kept in float by quantizing the
  calibrated model again.

Measured in export/README.md (on-device section): one partition for the
conv nets and the encoders, int8/float32 latency 0.5-0.7, rms error as the
plain int8 file's.
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from kerasnorm._compat import interpreter_ops
from kerasnorm._compat import tflite_calibrated
from kerasnorm._compat import tflite_quantize_calibrated
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.naming.names import SIGNATURE_KEY
from kerasnorm.export.tflite.float_nodes import embedding_nodes
from kerasnorm.export.tflite.float_nodes import normalization_nodes
from kerasnorm.export.tflite.float_nodes import query_key_nodes
from kerasnorm.export.tflite.float_nodes import query_key_split_ops
from kerasnorm.export.tflite.float_nodes import score_nodes

# int8 kernels XNNPACK lacks (ai-edge-litert 2.3): left int8, each splits the
# graph; in float each runs inside the partition. MEAN is delegated in int8,
# but GroupNorm's runs 1.3x faster in float (conv net: 0.70 of float32
# against 0.91) and no other model measured changes.
# DIV (a masked average pooling's division) has no int8 kernel either.
FLOAT_OPS = ("BATCH_MATMUL", "SOFTMAX", "GELU", "MEAN", "DIV")
_ROOTS = ("RSQRT", "SQRT")
_ELEMENTWISE = ("ADD", "MUL")
_REDUCTIONS = ("MEAN", "SUM")
_SQUARES = ("SQUARED_DIFFERENCE", "SQUARE")
# GroupNorm's channel-space statistics (`_core.lowering`): a per-channel
# `MEAN`, then the block product averaging each group, reshaped back.
_GROUP_AVERAGE = ("FULLY_CONNECTED", "RESHAPE")
# XNNPACK's int8 scale-ratio bounds per binary op (`xnnpack_refused`).
_RATIO_BOUNDS = {
    "ADD": (2.0**-10, 2.0**8),
    "SUB": (2.0**-10, 2.0**8),
    "MUL": (2.0**-16, 2.0**8),
}


@dataclasses.dataclass(frozen=True)
class SelectiveInt8:
    """A selectively quantized file and what it computes in float.

    Attributes:
        content: the flatbuffer's bytes.
        float_ops: op name -> count of the ops computing in float (not
            counting the `DEQUANTIZE`s that feed them), sorted by name.
    """

    content: bytes
    float_ops: dict


def statistics_nodes(content: bytes) -> list:
    """The output tensor names of every norm's statistics ops in a float file.

    From each `RSQRT` (or `SQRT`) back through `ADD`/`MUL` (epsilon, scale)
    and a group average (`FULLY_CONNECTED`, `RESHAPE`) to the first
    `MEAN`/`SUM` and the squaring op that feeds it, and the mean that op
    centres by; the walk stops there, so a residual `ADD` before the norm is
    never included.
    """
    interpreter = _listing(content)
    ops = interpreter_ops(interpreter)
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    producer = {int(t): op for op in ops for t in op["outputs"]}
    chosen = {}
    for op in ops:
        if op["op_name"] in _ROOTS:
            for member in _statistics_chain(op, producer):
                chosen[member["index"]] = member
    return sorted(
        names[int(t)] for op in chosen.values() for t in op["outputs"] if t >= 0
    )


def _statistics_chain(root, producer):
    chain, op = [root], root
    while op["op_name"] not in _REDUCTIONS:
        sources = [producer.get(int(t)) for t in op["inputs"]]
        sources = [s for s in sources if s is not None]
        if (
            op["op_name"] in _ROOTS + _ELEMENTWISE + _GROUP_AVERAGE
            and len(sources) == 1
        ):
            op = sources[0]
            if _is_square(op):
                # A norm over one channel: the converter drops the mean over
                # a size-1 axis, so the square is `SQUARED_DIFFERENCE(x, x)`,
                # always 0. In int8 its range is the epsilon's, and LiteRT
                # aborts preparing it (`_is_square`'s note).
                return [*chain, op]
            if op["op_name"] not in _ELEMENTWISE + _REDUCTIONS + _GROUP_AVERAGE:
                return [root]
            chain.append(op)
        else:
            return [root]
    square = producer.get(int(op["inputs"][0]))
    if square is not None and _is_square(square):
        chain.append(square)
        centred = producer.get(int(square["inputs"][0]))
        if centred is not None and centred["op_name"] == "SUB":
            chain += _group_mean(producer.get(int(centred["inputs"][1])), producer)
    return chain


def _group_mean(op, producer):
    """The ops of a mean through a group average (`RESHAPE` of a
    `FULLY_CONNECTED` of a `MEAN`), else none: a plain `MEAN` is float
    already (`FLOAT_OPS`)."""
    chain = []
    while op is not None and op["op_name"] in _GROUP_AVERAGE:
        chain.append(op)
        op = producer.get(int(op["inputs"][0]))
    if not chain or op is None or op["op_name"] not in _REDUCTIONS:
        return []
    return [*chain, op]


def _is_square(op):
    """A squaring op. Kept in float for speed, and because an int8
    `SQUARED_DIFFERENCE` of a tensor with itself aborts the process: its
    calibrated range is empty, its output scale (epsilon / 255, 1e-8 for a
    Keras `LayerNormalization(epsilon=1e-6)`) makes the requantization
    multiplier (2 x input scale)^2 / (2^14 x output scale) exceed what
    LiteRT's int8 kernel checks when it prepares (a `TFLITE_CHECK`, not an
    error status)."""
    if op["op_name"] in _SQUARES:
        return True
    return op["op_name"] == "MUL" and len(set(map(int, op["inputs"]))) == 1


def quantize_selectively(
    float_content: bytes,
    representative_dataset,
    *,
    float_ops=FLOAT_OPS,
    keep_statistics: bool = True,
    int8_io: bool = False,
) -> SelectiveInt8:
    """int8 quantization of a float32 file, some ops left in float.

    Args:
        float_content: the float32 flatbuffer (one signature,
            `serving_default`), as `litert.convert` writes it.
        representative_dataset: a callable returning an iterator of
            `{input name: array}` feeds, batch first, as `litert.convert`'s.
        float_ops: op types computed in float wherever they are. Defaults to
            `FLOAT_OPS`.
        keep_statistics: also keep in float every norm's statistics and
            normalization and every attention's scores (`kept_float_nodes`).
            Defaults to `True`.
        int8_io: make the model's inputs and outputs int8. Defaults to
            `False`.

    Returns:
        A `SelectiveInt8`.
    """
    calibrated = tflite_calibrated(
        float_content,
        lambda: ((SIGNATURE_KEY, feed) for feed in representative_dataset()),
    )
    nodes = kept_float_nodes(float_content) if keep_statistics else []
    if keep_statistics:
        float_ops = (*float_ops, *query_key_split_ops(float_content))
    while True:
        content = tflite_quantize_calibrated(
            calibrated,
            float_ops=float_ops,
            float_nodes=nodes,
            io_type=tf.int8 if int8_io else None,
        )
        refused = [] if int8_io else sorted(set(xnnpack_refused(content)) - set(nodes))
        if not refused:
            return SelectiveInt8(bytes(content), float_compute_ops(content))
        nodes = sorted({*nodes, *refused})


def xnnpack_refused(content: bytes) -> list:
    """The output tensor names of a file's int8 `ADD`/`SUB`/`MUL` ops whose
    scales XNNPACK's int8 kernels refuse, so LiteRT runs them outside the
    partition.

    XNNPACK (`xnn_create_add_nd_qs8`, `xnn_create_multiply_nd_qs8`) takes an
    int8 sum or difference only when each input-to-output scale ratio is in
    [2**-10, 2**8), and a product only when the ratio of the two inputs'
    product scale to the output scale is in [2**-16, 2**8). A small constant
    added to a wide tensor falls below: a trained norm's `beta` (|beta| under
    1/1000 of the output range) added to a (batch, tokens, channels) tensor.
    In float the op runs inside the partition.
    """
    interpreter = _listing(content)
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    refused = []
    for op in interpreter_ops(interpreter):
        if op["op_name"] not in _RATIO_BOUNDS:
            continue
        ends = [tensors[int(t)] for t in (*op["inputs"], *op["outputs"]) if t >= 0]
        scales = [_int8_scale(t) for t in ends]
        if len(ends) != 3 or None in scales:
            continue
        low, high = _RATIO_BOUNDS[op["op_name"]]
        *inputs, output = scales
        if op["op_name"] == "MUL":
            ratios = [inputs[0] * inputs[1] / output]
        else:
            ratios = [s / output for s in inputs]
        if any(not low <= r < high for r in ratios):
            refused.append(ends[-1]["name"])
    return refused


def _int8_scale(tensor):
    """A per-tensor int8 tensor's scale, else None."""
    if tensor["dtype"] != np.int8:
        return None
    scales = tensor["quantization_parameters"]["scales"]
    return float(scales[0]) if len(scales) == 1 else None


def kept_float_nodes(content: bytes) -> list:
    """Every tensor `quantize_selectively` keeps in float by name: each
    norm's statistics (`statistics_nodes`) and normalization, the
    attention scores, queries and keys, and a token lookup scaled by a
    constant (`tflite.float_nodes`)."""
    nodes = statistics_nodes(content)
    nodes += normalization_nodes(content) + score_nodes(content)
    nodes += embedding_nodes(content) + query_key_nodes(content)
    return sorted(set(nodes))


def float_compute_ops(content: bytes) -> dict:
    """Op name -> count of a file's ops with a float output, other than
    `DEQUANTIZE`: in an int8 file, the ops that compute in float."""
    interpreter = _listing(content)
    dtypes = {t["index"]: t["dtype"] for t in interpreter.get_tensor_details()}
    counts = collections.Counter(
        op["op_name"]
        for op in interpreter_ops(interpreter)
        if op["op_name"] != "DEQUANTIZE"
        and any(dtypes.get(int(t)) == np.float32 for t in op["outputs"])
    )
    return dict(sorted(counts.items()))


def _listing(content):
    return unallocated(bytes(content))
