"""Rewrites for the 16x8 quantizer, and the zero-scale check of its output.

The 16x8 quantizer (16-bit activations, 8-bit weights) has no `SQUARE`,
`SQUARED_DIFFERENCE` or `NEG` kernel (TF 2.21). `square_as_mul` rewrites the
traced graph so that `Square(x)` is `Mul(x, x)`, `SquaredDifference(a, b)`
is `Mul(a - b, a - b)` and `Neg(x)` is `Mul(x, -1)`: the same values, in ops
it quantizes. The training graph keeps the one-op forms.
"""

from __future__ import annotations

import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm.export._common.errors import ExportConversionError
from kerasnorm.export.litert.runner import unallocated


def square_as_mul(function):
    """A concrete function computing what `function` computes, its variables
    frozen, with `Square`, `SquaredDifference` and `Neg` written with `Mul`
    (the module docstring says why)."""
    frozen = convert_variables_to_constants(function)
    graph_def = frozen.graph.as_graph_def()
    _rewrite(graph_def.node, top_level=True)
    # Inside a function body a node's outputs are named `node:out:0`, not
    # `node:0`: only the rewrite that adds no node is done there.
    for function_def in graph_def.library.function:
        _rewrite(function_def.node_def, top_level=False)
    specs = list(function.structured_input_signature[0])
    structure = function.structured_outputs
    feeds = [t.name for t in frozen.inputs]
    fetches = [t.name for t in frozen.outputs]

    def imported():
        tf.graph_util.import_graph_def(graph_def, name="")

    pruned = tf.compat.v1.wrap_function(imported, []).prune(feeds, fetches)

    @tf.function(input_signature=specs)
    def serve(*args):
        # Named outputs (a streaming step's dict) keep their names.
        return tf.nest.pack_sequence_as(structure, list(pruned(*args)))

    return serve.get_concrete_function()


def _rewrite(nodes, *, top_level):
    extra = []
    for node in nodes:
        if node.op == "Square":
            node.op = "Mul"
            node.input.insert(1, node.input[0])
        elif node.op == "Neg" and top_level:
            minus_one = tf.compat.v1.NodeDef(
                name=f"{node.name}/kerasnorm_minus_one", op="Const"
            )
            minus_one.attr["dtype"].CopyFrom(node.attr["T"])
            minus_one.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(-1.0, tf.as_dtype(node.attr["T"].type))
            )
            extra.append(minus_one)
            node.op = "Mul"
            node.input.insert(1, minus_one.name)
        elif node.op == "SquaredDifference" and top_level:
            sub = tf.compat.v1.NodeDef(
                name=f"{node.name}/kerasnorm_difference",
                op="Sub",
                input=list(node.input[:2]),
            )
            sub.attr["T"].CopyFrom(node.attr["T"])
            extra.append(sub)
            node.op = "Mul"
            controls = list(node.input[2:])
            del node.input[:]
            node.input.extend([sub.name, sub.name, *controls])
    nodes.extend(extra)


def refuse_zero_scales(content, mode):
    """Raise ExportConversionError when a quantized tensor of the file has a
    zero scale: TFLite's int16 kernels abort the process preparing it (TF
    2.21), so the parity run would kill the caller. The 16x8 quantizer gives
    a tensor that is 0 on every calibration sample a zero symmetric range:
    in an unrolled LN-GRU, the norm of `h @ U` at the first step, where `h`
    is the zero initial state, when the converter has not folded it away."""
    if not mode.calibrates:
        return
    quantize = mode.name
    zero = [
        t["name"]
        for t in unallocated(content).get_tensor_details()
        if len(t["quantization_parameters"]["scales"])
        and not t["quantization_parameters"]["scales"].all()
    ]
    if zero:
        raise ExportConversionError(
            f"quantize={quantize!r} gave tensor(s) {', '.join(map(repr, zero[:5]))} "
            "a zero quantization scale: they are 0 on every representative "
            "sample (a product with a zero initial state, say), and TFLite's "
            "kernels abort the process on a zero scale, so the file was not "
            'run or written. Export with quantize="int8" or "dynamic", or '
            "give the recurrent layer a non-zero initial state."
        )
