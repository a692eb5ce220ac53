"""What to say when a half-precision file fails its parity check.

A `quantize="float16"` file stores every float constant in float16, whose
spacing grows with the magnitude: 2**-10 of it, so 4 near 6,300. A weight
of a few units loses nothing that matters; a large constant (a sinusoidal
time embedding's frequencies, up to ~6,300, multiplied by a time step up
to 1,000) loses its phase. `half_precision_hint` names the layers whose
constants the file stores largest, with the spacing they were rounded to,
and what to try.
"""

from __future__ import annotations

import collections

import numpy as np

from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.convert import trace
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.model.op_layers import OUTSIDE
from kerasnorm.export.model.op_layers import layer_list
from kerasnorm.export.model.op_layers import recording
from kerasnorm.export.numerics.errors import with_sentence

# A constant whose float16 spacing is at least this is named: spacing 1/8
# from |c| = 128 (smaller ones are rounded by less than a typical weight's
# own training noise).
LARGE_SPACING = 0.125


def large_half_constants(content) -> list[tuple[str, float, list[str]]]:
    """`[(tensor name, max |value|, names of its uses)]` of the float16
    constants of a `.tflite` file whose spacing is at least `LARGE_SPACING`,
    largest first. The uses are the output tensors of the ops reading the
    constant, through its `DEQUANTIZE`: a converter may name the constant
    itself after no graph node (TensorFlow 2.19's `arith.constant`), while
    the ops it feeds keep their layer's name."""
    interpreter = unallocated(content)
    details = interpreter.get_tensor_details()
    names = {d["index"]: d["name"] for d in details}
    readers = collections.defaultdict(list)
    for op in interpreter_ops(interpreter):
        for i in op["inputs"]:
            readers[int(i)].append(op)
    found = []
    for detail in details:
        if detail["dtype"] != np.float16:
            continue
        try:
            value = interpreter.get_tensor(detail["index"])
        except ValueError:
            continue
        largest = float(np.max(np.abs(value), initial=0.0))
        if np.spacing(np.float16(largest)) >= LARGE_SPACING:
            uses = _uses(detail["index"], readers, names)
            found.append((detail["name"], largest, uses))
    return sorted(found, key=lambda item: -item[1])


def _uses(index, readers, names):
    """The names of the tensors computed from tensor `index`, through
    `DEQUANTIZE` ops."""
    uses = []
    for op in readers[index]:
        for out in op["outputs"]:
            if op["op_name"] == "DEQUANTIZE":
                uses.extend(_uses(int(out), readers, names))
            else:
                uses.append(names[int(out)])
    return uses


def with_half_precision_hint(err, prepared, path):
    """`err` (a failed check of the file at `path`) with
    `half_precision_hint` after its first sentence, for a `"float16"`
    whole-model `.tflite` file; else `err` itself."""
    options = prepared.options
    if not options.format.hints_half_constants or options.quantize != "float16":
        return err
    if prepared.streaming:
        return err
    with open(path, "rb") as f:
        content = f.read()
    hint = half_precision_hint(content, prepared)
    # After the message's first sentence, before the figures.
    return with_sentence(err, hint)


def half_precision_hint(content, prepared) -> str:
    """A sentence for a failed float16 check of `content` (the file of
    `prepared`): the layers with the largest float16 constants and their
    rounding, and what to try."""
    try:
        constants = large_half_constants(content)
    except Exception:
        constants = []
    advice = (
        "quantize=None (float32) or 'dynamic' (int8 weights, float "
        "computation), which keep the constants in float32"
    )
    if not constants:
        return (
            "No constant of the file is large enough for float16 to round it "
            "by more than 1/8: the rounding of many weights adds up. Try "
            f"{advice}."
        )
    nodes = [n for name, _, uses in constants for n in (name, *uses)]
    layers = _layers_of(prepared, nodes)
    name, largest, _ = constants[0]
    spacing = float(np.spacing(np.float16(largest)))
    where = f"layer(s) {layer_list(layers)}" if layers else f"tensor {name!r}"
    return (
        f"The file stores the constants of {where} in float16, up to "
        f"{largest:.3g}, where float16's spacing is {spacing:g}: multiplied by "
        "large inputs "
        "(a time step, a position) that rounding is what differs. Compute "
        "those constants from smaller ones inside the layer, or try "
        f"{advice}."
    )


def _layers_of(prepared, tensor_names):
    """The layers that created `tensor_names`, from the trace the writer
    converts (`prepared`'s exported model at its signature and shapes)."""
    model = prepared.exported
    try:
        with recording(model) as ops:
            trace(
                model,
                prepared.inputs,
                (list(prepared.inputs.names), prepared.output_names),
                prepared.shapes,
                recurrent=prepared.facts.recurrent,
            )
    except Exception:
        return []
    # A TFLite tensor is named after the graph node(s) it came from, fused
    # ones joined by ";".
    nodes = [part for name in tensor_names for part in name.split(";")]
    found = ops.layers_of_nodes(nodes)
    layers = list(dict.fromkeys(x for xs in found.values() for x in xs))
    return [layer for layer in layers if layer != OUTSIDE][:4]
