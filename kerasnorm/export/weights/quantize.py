"""A generative file's weights quantized in its flatbuffer.

The converter writes the file in float32; this pass rewrites its constant
weights (`quantize_weights`) as the mode's row of
`options.generative_modes` says (its `products` and `lookup`):

- every mode: identical constant buffers are stored once (a tied head's
  weights are the embedding table itself, which the converter writes twice);
- `"dynamic"`: each `FULLY_CONNECTED`'s weights int8, symmetric per output
  channel; the op quantizes its input per call (dynamic range, as the
  converter's own dynamic mode writes);
- `"int4"`: the same weights int4 in blocks of `block_size` along the input
  dimension, one float16 scale per block (`BlockwiseQuantization`, which
  XNNPACK runs with int8 dynamic-range activations); a weight whose input
  dimension the block does not divide is refused;
- `"weight_only_int8"`: the weights int8 per channel and a `DEQUANTIZE` op
  before each product: the arithmetic stays float32;
- in the three: each embedding lookup (`GATHER` of a float table) reads an
  int8 table with one float scale per row (`GATHER`, `CAST`, and a `MUL` by
  the row's gathered scale); in `"int4"` the table's int4 blocks, the
  gathered rows dequantized to their integers and multiplied by their
  blocks' gathered scales. A tied head multiplies by the same integers with
  the same scales: the table is stored once, for both.

The scales round to float16 through bfloat16 (XNNPACK holds blockwise scales
in bfloat16), so the stored scale is the one the kernel multiplies by.

`known` weights (a model Keras quantized to int4: `keras_quantized`) are
written from Keras' own integers, found by their float32 content: their
blocks lie inside Keras' blocks and carry Keras' scales; Keras' zero
points, which LiteRT's block-wise int4 has no place for, become two small
float products subtracted from the int4 one (`zero_point_products`), and a
`SUB` of the looked-up rows' zero points in a lookup.
"""

from __future__ import annotations

import numpy as np

from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import INT4_BLOCKS
from kerasnorm.export.options.generative_modes import INT8_DEQUANTIZED
from kerasnorm.export.options.generative_modes import INT8_DYNAMIC
from kerasnorm.export.weights.buffers import buffer_bytes
from kerasnorm.export.weights.buffers import builtin_code
from kerasnorm.export.weights.buffers import opcode_index
from kerasnorm.export.weights.buffers import read_model
from kerasnorm.export.weights.buffers import share_identical_buffers
from kerasnorm.export.weights.buffers import write_model
from kerasnorm.export.weights.int_weights import int4_blocks
from kerasnorm.export.weights.int_weights import int8_rows
from kerasnorm.export.weights.int_weights import keras_int4_blocks
from kerasnorm.export.weights.int_weights import pack_int4
from kerasnorm.export.weights.int_weights import weights_key
from kerasnorm.export.weights.lookups import Lookups

# The modes this pass quantizes for, each by its row's `products` and
# `lookup` (`options.generative_modes`).
WEIGHT_MODES = tuple(m.name for m in GENERATIVE_MODES.values() if m.pass_mode)


def _schema():
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


def quantize_weights(
    content: bytes, mode, block_size=32, known=None, *, indivisible
) -> bytes:
    """`content` (a float32 flatbuffer) with its weights quantized for
    `mode` (a row name of `GENERATIVE_MODES`; None: only identical buffers
    shared); `known`: Keras' int4 weights by `weights_key` of their float32
    `(out, in)` values, each with its file block
    (`keras_quantized.int4_known`). `indivisible`: the caller's refusal of
    weights whose input dimension `block_size` does not divide, formatted
    with `name`, `shape` and `block`."""
    schema, fu = _schema()
    model, outside = read_model(fu, content)
    shared = share_identical_buffers(model)
    if mode is None and not shared:
        return content
    return _quantized(model, schema, fu, outside, mode, block_size, known, indivisible)


def quantize_model(
    model, outside, mode, block_size=32, known=None, *, indivisible
) -> bytes:
    """The file of `model` (a `ModelT` whose buffers hold NumPy arrays, of
    `weights_schema()`) with its weights quantized for `mode` as
    `quantize_weights` does; `outside`: its buffers go after the
    flatbuffer. `model` is spent."""
    schema, fu = _schema()
    share_identical_buffers(model)
    return _quantized(model, schema, fu, outside, mode, block_size, known, indivisible)


def weights_schema():
    """`(schema, flatbuffer_utils)`, of `quantize_model`'s objects."""
    return _schema()


def _quantized(model, schema, fu, outside, mode, block_size, known, indivisible):
    if mode is not None:
        quantizer = _Quantizer(model, schema, fu, mode, block_size, known or {})
        quantizer.indivisible = indivisible
        quantizer.run()
    if outside:
        return write_model(schema, fu, model)
    return bytes(fu.convert_object_to_bytearray(model))


class _Quantizer(Lookups):
    def __init__(self, model, schema, fu, mode, block_size, known):
        self.model, self.schema, self.fu = model, schema, fu
        self.mode, self.block_size, self.known = mode, block_size, known
        self.row = GENERATIVE_MODES[mode]
        self.ops = schema.BuiltinOperator
        self.types = schema.TensorType
        # buffer index -> (q buffer, scales (rows,)); -> `_Int4` (int4)
        self._int8 = {}
        self._int4 = {}
        self._written_int4 = {}  # int4 buffer -> its `_Int4`
        self._row_scales = {}
        self._used_float = set()
        self.indivisible = None

    # --- buffers and tensors ----------------------------------------------

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

    def _int8_of(self, subgraph, index):
        """Buffer of the int8 rows of tensor `index`'s float buffer, and the
        scales (memoized per buffer: signatures share weights)."""
        tensor = subgraph.tensors[index]
        key = tensor.buffer
        if key not in self._int8:
            q, scale = int8_rows(self._float_weights(subgraph, index))
            self._int8[key] = (self._new_buffer(q), scale)
            self._used_float.add(key)
        return self._int8[key]

    def _set_int8(self, subgraph, index):
        tensor = subgraph.tensors[index]
        buffer, scale = self._int8_of(subgraph, index)
        tensor.buffer = buffer
        tensor.type = self.types.INT8
        params = self.schema.QuantizationParametersT()
        params.scale = scale.astype(np.float32)
        params.zeroPoint = np.zeros(scale.size, np.int64)
        params.quantizedDimension = 0
        tensor.quantization = params

    def _int4_of(self, subgraph, index):
        """The int4 blocks of tensor `index`'s float buffer (memoized per
        buffer: signatures, and a tied head and its lookup, share them):
        Keras' own where `known`, else rounded here."""
        tensor = subgraph.tensors[index]
        key = tensor.buffer
        if key not in self._int4:
            weights = self._float_weights(subgraph, index)
            keras = self.known.get(weights_key(weights))
            if keras is None:
                self._check_block(tensor, weights)
                q, scale = int4_blocks(weights, self.block_size)
                zero, block = None, self.block_size
            else:
                block = keras.file_block
                q, scale, zero = keras_int4_blocks(keras, block)
            self._int4[key] = _Int4(
                self._new_buffer(pack_int4(q)),
                self._new_buffer(scale),
                scale.shape,
                block,
                zero,
                keras if zero is not None else None,
            )
            self._written_int4[self._int4[key].buffer] = self._int4[key]
            self._used_float.add(key)
        return self._int4[key]

    def _set_int4(self, subgraph, index):
        tensor = subgraph.tensors[index]
        entry = self._int4_of(subgraph, index)
        buffer, scale_buffer, scale_shape = entry.buffer, entry.scales, entry.shape
        scales = self._new_tensor(
            subgraph,
            tensor.name + b"_scales",
            scale_shape,
            self.types.FLOAT16,
            scale_buffer,
        )
        details = self.schema.BlockwiseQuantizationT()
        details.scales = scales
        details.zeroPoints = -1
        details.blockSize = entry.block
        params = self.schema.QuantizationParametersT()
        params.detailsType = self.schema.QuantizationDetails.BlockwiseQuantization
        params.details = details
        params.quantizedDimension = 0
        tensor.buffer = buffer
        tensor.type = self.types.INT4
        tensor.quantization = params
        return entry

    # --- the pass ------------------------------------------------------------

    def run(self):
        tables = self._embedding_tables()
        for subgraph in self.model.subgraphs:
            self._subgraph(subgraph, tables)
        self._release_float()

    def _subgraph(self, subgraph, tables):
        gathers = []
        for op in subgraph.operators:
            table = op.inputs[0] if self._code(op) == self.ops.GATHER else -1
            if table >= 0 and subgraph.tensors[table].buffer in tables:
                # A tensor of its own: the converter may hand the head's
                # FULLY_CONNECTED the same tensor, which it quantizes.
                tensor = subgraph.tensors[table]
                op.inputs[0] = self._new_tensor(
                    subgraph, tensor.name, tensor.shape, tensor.type, tensor.buffer
                )
                gathers.append(op)
        head, zeros = [], []
        for op in subgraph.operators:
            if self._code(op) == self.ops.FULLY_CONNECTED:
                self._fully_connected(subgraph, op, head, zeros)
        for op, entry in zeros:
            self._zero_points(subgraph, op, entry)
        if self.row.lookup is not None:
            for op in gathers:
                self._gather(subgraph, op)
        subgraph.operators[:0] = head

    def _release_float(self):
        for key in self._used_float:
            if not self._still_float(key):
                self.model.buffers[key].data = None
                for subgraph in self.model.subgraphs:
                    for tensor in subgraph.tensors:
                        if tensor.buffer == key:
                            tensor.buffer = 0

    def _code(self, op):
        return builtin_code(self.model.operatorCodes[op.opcodeIndex])

    def _still_float(self, key):
        """Whether an op still reads buffer `key` as float (tensors no op
        reads any more are let go)."""
        for subgraph in self.model.subgraphs:
            for op in subgraph.operators:
                for i in op.inputs:
                    tensor = subgraph.tensors[i] if i >= 0 else None
                    if (
                        tensor is not None
                        and tensor.buffer == key
                        and tensor.type == self.types.FLOAT32
                    ):
                        return True
        return False

    def _embedding_tables(self):
        """Buffers of the float tables `GATHER`s look rows up in (axis 0)."""
        tables = set()
        for subgraph in self.model.subgraphs:
            for op in subgraph.operators:
                if self._code(op) != self.ops.GATHER:
                    continue
                weights = self._float_weights(subgraph, op.inputs[0])
                options = op.builtinOptions
                if (
                    weights is not None
                    and weights.ndim == 2
                    and getattr(options, "axis", 0) == 0
                    and getattr(options, "batchDims", 0) == 0
                ):
                    tables.add(subgraph.tensors[op.inputs[0]].buffer)
        return tables

    def _check_block(self, tensor, weights):
        if weights.shape[1] % self.block_size:
            raise ValueError(
                self.indivisible.format(
                    name=tensor.name.decode(),
                    shape=tuple(weights.shape),
                    block=self.block_size,
                )
            )

    def _fully_connected(self, subgraph, op, head, zeros):
        index = op.inputs[1]
        written = self._written_int4.get(subgraph.tensors[index].buffer)
        if written is not None and written.keras is not None:
            # A weights tensor another product read (and quantized) first.
            zeros.append((op, written))
            return
        weights = self._float_weights(subgraph, index)
        if weights is None or weights.ndim != 2:
            return
        tensor = subgraph.tensors[index]
        products = self.row.products
        if products == INT8_DEQUANTIZED:
            # The int8 weights dequantized by an op of their own.
            float_index = self._new_tensor(
                subgraph, tensor.name + b"_dequantized", tensor.shape, tensor.type
            )
            quantized = self._new_tensor(
                subgraph, tensor.name, tensor.shape, tensor.type, tensor.buffer
            )
            self._set_int8(subgraph, quantized)
            head.append(self._op(self.ops.DEQUANTIZE, [quantized], [float_index]))
            op.inputs[1] = float_index
            return
        if products == INT4_BLOCKS:
            entry = self._set_int4(subgraph, index)
            if entry.keras is not None:
                zeros.append((op, entry))
        elif products == INT8_DYNAMIC:
            self._set_int8(subgraph, index)
            if op.builtinOptions is not None:
                op.builtinOptions.asymmetricQuantizeInputs = True


class _Int4:
    """A buffer's int4 blocks in the file: the packed integers' and the
    scales' buffers, the scales' shape `(out, in // block)`, the block, the
    zero points per block (Keras' asymmetric int4; else None) and Keras'
    weights they came from, with the zero-point products' buffers once
    written."""

    def __init__(self, buffer, scales, shape, block, zero, keras):
        self.buffer, self.scales, self.shape = buffer, scales, shape
        self.block, self.zero, self.keras = block, zero, keras
        self.products = self.product_shapes = None
