"""Interpreters allocated once per set of input shapes.

LiteRT's `SignatureRunner` resizes the inputs and re-allocates the tensors
on every call; for a file with a dynamic dimension that re-plans the whole
graph each time (a conv net's Keras export: 2.7 ms a call against 0.11 ms
allocated once). Its XNNPACK also computes the first call after an
allocated fast int8 file is resized to a longer sequence wrong (rms error
0.65 of the output where 0.034 is right, an encoder grown from 8 to 64
tokens), while an interpreter allocated at its shape is right. So each set
of input shapes gets its own interpreter, resized and allocated once, and a
call only sets the inputs, invokes and reads the outputs.
"""

from __future__ import annotations

from kerasnorm._core.dependencies import require_litert
from kerasnorm.export.litert.convert import stderr_captured

# Interpreters kept for the input shapes of one file, the most recent.
KEPT = 4


def unallocated(content):
    """An interpreter over flatbuffer bytes, no tensors allocated yet."""
    require_litert("Running a .tflite file")
    from ai_edge_litert.interpreter import Interpreter

    with stderr_captured(True):
        return Interpreter(model_content=content)


class Allocated:
    """One interpreter of `content` allocated at `shapes` ({input name:
    shape}; None: the file's own), its signature's tensors by name
    (`inputs` / `outputs`: the signature runner's details)."""

    def __init__(self, content, inputs, outputs, shapes=None):
        self._interpreter = unallocated(content)
        for name, shape in (shapes or {}).items():
            self._interpreter.resize_tensor_input(inputs[name]["index"], shape)
        with stderr_captured(True):  # XNNPACK's "Created ... delegate" line
            self._interpreter.allocate_tensors()
        self._inputs = {name: d["index"] for name, d in inputs.items()}
        self._outputs = {name: d["index"] for name, d in outputs.items()}

    def __call__(self, feed):
        """The outputs by name for `feed` ({input name: array} at the
        allocated shapes), copies."""
        for name, value in feed.items():
            self._interpreter.set_tensor(self._inputs[name], value)
        self._interpreter.invoke()
        return {
            name: self._interpreter.get_tensor(index)
            for name, index in self._outputs.items()
        }


class Allocations:
    """The `Allocated` interpreters of one file, by input shapes: a new set
    of shapes allocates one (the last `KEPT` are kept), the same shapes
    reuse it. `count` says how many were allocated."""

    def __init__(self, content, inputs, outputs):
        self._content, self._inputs, self._outputs = content, inputs, outputs
        self._by_shapes = {}
        self.count = 0

    def at(self, feed):
        """The interpreter allocated at `feed`'s shapes."""
        key = tuple(sorted((name, tuple(x.shape)) for name, x in feed.items()))
        allocated = self._by_shapes.pop(key, None)
        if allocated is None:
            shapes = {name: shape for name, shape in key}
            allocated = Allocated(self._content, self._inputs, self._outputs, shapes)
            self.count += 1
        self._by_shapes[key] = allocated  # the most recent last
        while len(self._by_shapes) > KEPT:
            self._by_shapes.pop(next(iter(self._by_shapes)))
        return allocated
