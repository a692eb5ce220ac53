"""What the weights pass (`weights.quantize`) builds its rewrites from:
new buffers, tensors and ops of a flatbuffer's `ModelT` (`Edits`, the base
of its quantizer and lookups), the int4 blocks it writes per buffer
(`Int4Entry`), and the products written in other blocks than asked
(`Fallback`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from kerasnorm.export.weights.buffers import buffer_bytes
from kerasnorm.export.weights.buffers import builtin_code
from kerasnorm.export.weights.buffers import opcode_index


def flatbuffer_schema():
    """The flatbuffer schema and its reader/writer, as one pair (the objects
    one builds the other writes). LiteRT ships both from 2.x; LiteRT 1.3,
    the oldest tested, has no `tools`, and TensorFlow's copies serve."""
    try:
        from ai_edge_litert import schema_py_generated as schema
        from ai_edge_litert.tools import flatbuffer_utils
    except ImportError:
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils
    return schema, flatbuffer_utils


class Edits:
    """Buffers, tensors and ops added to `self.model` (a `ModelT` of
    `self.schema`), and the reads the rewrites share."""

    def _new_buffer(self, data):
        buffer = self.schema.BufferT()
        buffer.data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.model.buffers.append(buffer)
        return len(self.model.buffers) - 1

    def _new_tensor(self, subgraph, name, shape, dtype, buffer=0, signature=None):
        tensor = self.schema.TensorT()
        tensor.name = name
        tensor.shape = list(shape)
        if signature is not None:
            tensor.shapeSignature = list(signature)
        tensor.type = dtype
        tensor.buffer = buffer
        subgraph.tensors.append(tensor)
        return len(subgraph.tensors) - 1

    def _op(self, builtin, inputs, outputs, options_type=0, options=None):
        op = self.schema.OperatorT()
        op.opcodeIndex = opcode_index(self.schema, self.fu, self.model, builtin)
        op.inputs, op.outputs = list(inputs), list(outputs)
        op.builtinOptionsType = options_type
        op.builtinOptions = options
        return op

    def _float_weights(self, subgraph, index):
        """The float32 array of constant tensor `index`, or None."""
        if index < 0:
            return None
        tensor = subgraph.tensors[index]
        data = buffer_bytes(self.model.buffers[tensor.buffer])
        if tensor.type != self.types.FLOAT32 or data is None:
            return None
        return data.view(np.float32).reshape(tensor.shape)

    def _code(self, op):
        return builtin_code(self.model.operatorCodes[op.opcodeIndex])


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A product (or table) written in other blocks than the export's
    `int4_block_size`, which does not divide its input dimension: its
    weights' name, `(rows, input)`, the block asked for and the one
    written (`"int8"`: int8 per row, no smaller block divides)."""

    name: str
    shape: tuple
    asked: int
    written: object

    def __str__(self):
        written = (
            "int8 per row"
            if self.written == "int8"
            else f"int4 blocks of {self.written}"
        )
        return (
            f"{self.name} {self.shape}: {written} (blocks of {self.asked} do "
            f"not divide {self.shape[1]})"
        )


@dataclasses.dataclass(frozen=True)
class Rounded:
    """A product whose int4 was calibrated (`int_weights.int4_rounding`):
    its weights' name, `(rows, input)`, the calibration rows it had and
    whether GPTQ rounded it (else rounded to nearest: too few rows)."""

    name: str
    shape: tuple
    rows: int
    gptq: bool
    bits: int = 4

    def __str__(self):
        how = "GPTQ" if self.gptq else "rounded to nearest (too few rows)"
        return (
            f"{self.name} {self.shape}: int{self.bits} {how}, "
            f"{self.rows} calibration rows"
        )


class Int4Entry:
    """A buffer's int4 blocks in the file: the packed integers' and the
    scales' buffers, the scales' shape `(out, in // block)`, the block, the
    zero points per block (Keras' asymmetric int4; else None) and Keras'
    weights they came from, with the zero-point products' buffers once
    written."""

    def __init__(self, buffer, scales, shape, block, zero, keras):
        self.buffer, self.scales, self.shape = buffer, scales, shape
        self.block, self.zero, self.keras = block, zero, keras
        self.products = self.product_shapes = None
