"""Refusing the full-integer file of a norm over one channel, which LiteRT
cannot load.

Over a single channel a norm's mean is the input itself, and the converter
drops the mean over that size-1 axis: the variance becomes
`SQUARED_DIFFERENCE(x, x)`, 0 on every sample (or, where the graph centres
first, the centred input `SUB(x, x)`, as an int16x8 file of Keras'
`LayerNormalization` holds: its calibrated scale underflows to 1e-43).
Calibrated, its int8 range is only the epsilon's (1e-8 a step for
`epsilon=1e-6`), and the requantization multiplier of that op,
(2 x input scale)^2 / (2^14 x output scale), is then beyond what LiteRT's
int8 kernel checks when it allocates: a `TFLITE_CHECK` that aborts the
process, with or without XNNPACK. The fast int8 file keeps the op in float
(`selective._statistics_chain`); the full-integer files (`int8_io=True`,
`"int16x8"`) cannot, so they are
refused before they run.
"""

from __future__ import annotations

import numpy as np

from kerasnorm._compat import interpreter_ops
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.model.op_layers import tensor_layer
from kerasnorm.export.numerics.errors import ExportConversionError

# Integer ops whose output is 0 on every sample when both inputs are one
# tensor.
_SELF_ZERO = ("SQUARED_DIFFERENCE", "SUB")


def self_squares(content: bytes) -> list:
    """The output tensor names of a file's integer `SQUARED_DIFFERENCE` and
    `SUB` ops whose two inputs are one tensor."""
    interpreter = unallocated(bytes(content))
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    found = []
    for op in interpreter_ops(interpreter):
        if op["op_name"] not in _SELF_ZERO:
            continue
        first, second = (int(t) for t in op["inputs"][:2])
        output = tensors[int(op["outputs"][0])]
        if first == second and np.issubdtype(output["dtype"], np.integer):
            found.append(output["name"])
    return found


def refuse_self_squares(content: bytes, ops, quantize) -> None:
    """Raise ExportConversionError, naming the layer, when the file holds an
    integer `SQUARED_DIFFERENCE(x, x)` or `SUB(x, x)` (the module docstring
    says why);
    `ops`: the trace's `op_layers.OpLayers`, which names it."""
    found = self_squares(content)
    if not found:
        return
    layers = sorted({tensor_layer(name, ops) for name in found})
    raise ExportConversionError(
        f"Layer(s) {', '.join(map(repr, layers))} normalize over a single "
        f"channel: their input minus its mean is x - x (their variance "
        f"SQUARED_DIFFERENCE(x, x)), 0 on every sample, which LiteRT cannot "
        f"prepare in integers (it refuses the file, or aborts the process "
        f"allocating it), "
        f"so the quantize={quantize!r} full-integer "
        "file was not run or written. Export with quantize='int8' and "
        "int8_io=False (that op stays in float), or remove the norm: over one "
        "channel its output is its offset (beta), whatever the input."
    )
