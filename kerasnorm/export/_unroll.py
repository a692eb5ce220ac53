"""Export-time rewrites for full-integer TFLite: unrolled recurrent layers,
and normalization statistics in ops the 16x8 quantizer supports.

TFLite's full-integer calibration crashes the process on a recurrent layer
that runs as a loop (a `WHILE` op). The same layer with `unroll=True` and the
same weights computes the same function with one copy of the cell per time
step, which converts. `unroll_rolled_loops` makes that copy of the model.

The 16x8 quantizer (16-bit activations, 8-bit weights) has no `SQUARE`,
`SQUARED_DIFFERENCE` or `NEG` kernel (TF 2.21). `square_as_mul` rewrites the
traced graph so that `Square(x)` is `Mul(x, x)`, `SquaredDifference(a, b)`
is `Mul(a - b, a - b)` and `Neg(x)` is `Mul(x, -1)`: the same values, in ops
it quantizes. The training graph keeps the one-op forms.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm._compat import input_tensors_of_calls

# Full-integer modes: they calibrate activations and need loop-free graphs.
FULL_INTEGER_MODES = ("int8", "int16x8")

# The longest sequence `unroll_rolled_loops` unrolls by default. An unrolled
# layer holds one copy of its cell per step: converter time grows linearly
# with the length (docs/design.md has the figures for a LayerNormLSTM(32)),
# and so does the file, since each copy keeps its own quantized constants.
MAX_UNROLL_STEPS = 64


def rolled_layers(layer):
    """The outermost layers of `layer` that run a rolled recurrent loop:
    recurrent layers with `unroll=False`, and wrappers (Bidirectional) around
    one; models are searched."""
    if _is_rolled(layer):
        yield layer
        return
    for child in getattr(layer, "layers", None) or []:
        yield from rolled_layers(child)


def _is_rolled(layer):
    if getattr(layer, "unroll", True) is False and hasattr(layer, "cell"):
        return True
    inner = [getattr(layer, n, None) for n in ("layer", "forward_layer")]
    return any(child is not None and _is_rolled(child) for child in inner)


def unroll_rolled_loops(model, *, quantize, max_steps=MAX_UNROLL_STEPS):
    """`(model, names)`: for a full-integer `quantize`, a copy of `model` with
    every rolled recurrent layer built with `unroll=True` (same weights, the
    user's model untouched) and the names of the layers it unrolled; else
    `model` itself and `()`.

    Raises ValueError naming the layer when its sequence length is undefined
    or above `max_steps`, or when the model cannot be rebuilt from its config.
    """
    # A tf_keras (QAT) model is not rebuilt here: `quantize_aware` refuses
    # rolled loops, and to_tflite refuses what is left.
    if quantize not in FULL_INTEGER_MODES or not isinstance(model, keras.Model):
        return model, ()
    loops = list(dict.fromkeys(rolled_layers(model)))
    if not loops:
        return model, ()
    names = tuple(layer.name for layer in loops)
    for layer in loops:
        steps = sequence_length(layer)
        if steps is None:
            raise ValueError(
                f"quantize={quantize!r} unrolls recurrent layer {layer.name!r} "
                "(TFLite's full-integer calibration crashes on a rolled loop), "
                "which needs a fixed sequence length; its input has an "
                f"undefined time dimension ({_shape_text(layer)}). Give the "
                "model a fixed length (keras.Input(shape=(steps, features))), or "
                'export it with quantize="dynamic" or "float16".'
            )
        if steps > max_steps:
            raise ValueError(
                f"quantize={quantize!r} would unroll recurrent layer "
                f"{layer.name!r} over {steps} time steps, more than "
                f"max_unroll_steps={max_steps}: the converter's time and the "
                "file's size grow with every unrolled step. Pass "
                f"max_unroll_steps={steps} (or more) to unroll it anyway, or "
                'export it with quantize="dynamic" or "float16".'
            )
    try:
        config = keras.saving.serialize_keras_object(model)
        copy = keras.saving.deserialize_keras_object(_unrolled_config(config))
        copy.set_weights(model.get_weights())
    except Exception as err:
        raise ValueError(
            f"quantize={quantize!r} needs recurrent layer(s) "
            f"{', '.join(map(repr, names))} unrolled, and the model could not "
            f"be rebuilt from its config to do that ({type(err).__name__}: "
            f"{str(err)[:300]}). Build the layer(s) with unroll=True, or export "
            'with quantize="dynamic" or "float16".'
        ) from err
    return copy, names


def _unrolled_config(config):
    if isinstance(config, dict):
        return {
            k: True if k == "unroll" and v is False else _unrolled_config(v)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [_unrolled_config(v) for v in config]
    return config


def sequence_length(layer):
    """The time dimension of `layer`'s (first) input; None when undefined or
    unknown."""
    shape = _input_shape(layer)
    if shape is None or len(shape) < 3:
        return None
    return shape[1]


def _input_shape(layer):
    for tensors in input_tensors_of_calls(layer):
        if tensors:
            return tuple(tensors[0].shape)
    build = layer.get_build_config() or {}
    shape = build.get("input_shape")
    if shape and not isinstance(shape[0], (list, tuple)):
        return tuple(shape)
    return None


def _shape_text(layer):
    shape = _input_shape(layer)
    return "shape unknown" if shape is None else f"shape {shape}"


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


def refuse_zero_scales(content, quantize):
    """Raise ExportConversionError when a quantized tensor of the file has a
    zero scale: TFLite's int16 kernels abort the process preparing it (TF
    2.21), so the parity run would kill the caller. The 16x8 quantizer gives
    a tensor that is 0 on every calibration sample a zero symmetric range:
    in an unrolled LN-GRU, the norm of `h @ U` at the first step, where `h`
    is the zero initial state, when the converter has not folded it away."""
    if quantize not in FULL_INTEGER_MODES:
        return
    from kerasnorm.export import litert
    from kerasnorm.export._artifacts import ExportConversionError

    zero = [
        t["name"]
        for t in litert._unallocated(content).get_tensor_details()
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
