"""Refusing the full-integer file of a norm over one channel, which LiteRT
cannot load.

Over a single channel a norm's mean is the input itself, and the converter
drops the mean over that size-1 axis: the variance becomes
`SQUARED_DIFFERENCE(x, x)`, 0 on every sample. Calibrated, its int8 range
is only the epsilon's (1e-8 a step for `epsilon=1e-6`), and the
requantization multiplier of that op, (2 x input scale)^2 / (2^14 x output
scale), is then beyond what LiteRT's int8 kernel checks when it allocates:
a `TFLITE_CHECK` that aborts the process, with or without XNNPACK. The fast
int8 file keeps the op in float (`selective._statistics_chain`); the
full-integer file (`int8_io=True`) cannot, so it is refused before it runs.
"""

from __future__ import annotations

import numpy as np

from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.numerics.errors import ExportConversionError


def self_squares(content: bytes) -> list:
    """The output tensor names of a file's integer `SQUARED_DIFFERENCE` ops
    whose two inputs are one tensor."""
    interpreter = unallocated(bytes(content))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    found = []
    for op in interpreter_ops(interpreter):
        if op["op_name"] != "SQUARED_DIFFERENCE":
            continue
        first, second = (int(t) for t in op["inputs"][:2])
        output = tensors[int(op["outputs"][0])]
        if first == second and np.issubdtype(output["dtype"], np.integer):
            found.append(output["name"])
    return found


def refuse_self_squares(content: bytes, ops, quantize) -> None:
    """Raise ExportConversionError, naming the layer, when the file holds an
    integer `SQUARED_DIFFERENCE(x, x)` (the module docstring says why);
    `ops`: the trace's `op_layers.OpLayers`, which names it."""
    found = self_squares(content)
    if not found:
        return
    layers = sorted({layer_of(name, ops) for name in found})
    raise ExportConversionError(
        f"Layer(s) {', '.join(map(repr, layers))} normalize over a single "
        f"channel: their variance is SQUARED_DIFFERENCE(x, x), 0 on every "
        f"sample, which LiteRT cannot prepare in int8 (it aborts the process "
        f"allocating the file), so the quantize={quantize!r} full-integer "
        "file was not run or written. Export with quantize='int8' and "
        "int8_io=False (that op stays in float), or remove the norm: over one "
        "channel its output is its offset (beta), whatever the input."
    )


def layer_of(tensor_name, ops) -> str:
    """The layer path that created the graph op a converter tensor is named
    after (the longest recorded op name inside the tensor's name), else the
    tensor's name."""
    records = getattr(ops, "records", ())
    best = None
    for record in records:
        if record.layer and record.name and record.name in tensor_name:
            if best is None or len(record.name) > len(best.name):
                best = record
    return best.layer if best is not None else tensor_name
