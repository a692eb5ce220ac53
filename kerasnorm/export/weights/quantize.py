"""A generative file's weights quantized in its flatbuffer.

The converter writes the file in float32; this pass rewrites its constant
weights (`quantize_weights`) as the mode's row of
`options.generative_modes` says (its `products` and `lookup`):

- every mode: identical constant buffers are stored once (a tied head's
  weights are the embedding table, which the converter writes twice);
- `"dynamic"`: each `FULLY_CONNECTED`'s weights int8, symmetric per output
  channel (rounded by GPTQ where `calibration` holds the product's
  inputs); the op quantizes its input per call (dynamic range, as the
  converter's own dynamic mode writes);
- `"int4"`: the same weights int4 in blocks of `block_size` along the input
  dimension, one float16 scale per block (`BlockwiseQuantization`, run by
  XNNPACK with dynamic int8 activations), rounded by GPTQ where
  `calibration` holds the product's inputs; a product the block does not
  divide takes a smaller one, or int8 (`Fallback`);
- `"weight_only_int8"`: the weights int8 per channel (GPTQ as in
  `"dynamic"`) and a `DEQUANTIZE` op before each product: the arithmetic
  stays float32;
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
from kerasnorm.export.options.generative_modes import GenerativeMode
from kerasnorm.export.weights.buffers import read_model
from kerasnorm.export.weights.buffers import share_identical_buffers
from kerasnorm.export.weights.buffers import write_model
from kerasnorm.export.weights.edits import Fallback
from kerasnorm.export.weights.edits import Int4Entry
from kerasnorm.export.weights.edits import Rounded
from kerasnorm.export.weights.edits import flatbuffer_schema as _schema
from kerasnorm.export.weights.int_weights import int4_blocks
from kerasnorm.export.weights.int_weights import int4_rounding
from kerasnorm.export.weights.int_weights import int8_rounding
from kerasnorm.export.weights.int_weights import int8_rows
from kerasnorm.export.weights.int_weights import keras_int4_blocks
from kerasnorm.export.weights.int_weights import pack_int4
from kerasnorm.export.weights.int_weights import weights_key
from kerasnorm.export.weights.lookups import Lookups

# The modes this pass quantizes for, each by its row's `products` and
# `lookup` (`options.generative_modes`).
WEIGHT_MODES = tuple(m.name for m in GENERATIVE_MODES.values() if m.pass_mode)


def quantize_weights(
    content: bytes,
    mode,
    block_size=32,
    known=None,
    *,
    indivisible=None,
    fallbacks=None,
    calibration=None,
) -> bytes:
    """`content` (a float32 flatbuffer) with its weights quantized for
    `mode` (a row name of `GENERATIVE_MODES`, or a row itself; None: only
    identical buffers shared); `known`: Keras' int4 weights by
    `weights_key` of their float32 `(out, in)` values, each with its file
    block (`keras_quantized.int4_known`). Weights whose input dimension
    `block_size` does not divide are written in the largest smaller block
    of the mode's sizes that divides it, else int8 per row, each appended
    to `fallbacks` (a list; a `Fallback`), or, with `indivisible` (the
    caller's refusal, formatted with `name`, `shape` and `block`),
    refused. `calibration`: products' inputs `(rows, in)` by `weights_key`
    of their weights (`calibration.product_inputs`): their int4 blocks or
    int8 rows rounded by GPTQ on them (`int_weights.int4_rounding`,
    `int8_rounding`)."""
    schema, fu = _schema()
    model, outside = read_model(fu, content)
    shared = share_identical_buffers(model)
    if mode is None and not shared:
        return content
    given = dict(indivisible=indivisible, fallbacks=fallbacks, calibration=calibration)
    return _quantized(model, schema, fu, outside, mode, block_size, known, **given)


def quantize_model(
    model,
    outside,
    mode,
    block_size=32,
    known=None,
    *,
    indivisible=None,
    fallbacks=None,
    calibration=None,
) -> bytes:
    """The file of `model` (a `ModelT` whose buffers hold NumPy arrays, of
    `weights_schema()`) with its weights quantized for `mode` as
    `quantize_weights` does; `outside`: its buffers go after the
    flatbuffer. `model` is spent."""
    schema, fu = _schema()
    share_identical_buffers(model)
    given = dict(indivisible=indivisible, fallbacks=fallbacks, calibration=calibration)
    return _quantized(model, schema, fu, outside, mode, block_size, known, **given)


def weights_schema():
    """`(schema, flatbuffer_utils)`, of `quantize_model`'s objects."""
    return _schema()


def _quantized(
    model, schema, fu, outside, mode, block_size, known, *, fallbacks, **given
):
    if mode is not None:
        quantizer = _Quantizer(model, schema, fu, mode, block_size, known or {})
        quantizer.indivisible = given["indivisible"]
        quantizer.calibration = given["calibration"] or {}
        quantizer.run()
        if fallbacks is not None:
            fallbacks.extend(quantizer.fallbacks)
        getattr(given["calibration"], "rounded", []).extend(quantizer.rounded)
        if given["calibration"] is not None:
            # Its products' inputs are spent: not held through the check.
            given["calibration"].clear()
    if outside:
        return write_model(schema, fu, model)
    return bytes(fu.convert_object_to_bytearray(model))


class _Quantizer(Lookups):
    def __init__(self, model, schema, fu, mode, block_size, known):
        self.model, self.schema, self.fu = model, schema, fu
        self.mode, self.block_size, self.known = mode, block_size, known
        self.row = mode if isinstance(mode, GenerativeMode) else GENERATIVE_MODES[mode]
        self.ops = schema.BuiltinOperator
        self.types = schema.TensorType
        # buffer index -> (q buffer, scales (rows,)); -> `Int4Entry` (int4)
        self._int8 = {}
        self._int4 = {}
        self._written_int4 = {}  # int4 buffer -> its `Int4Entry`
        self._row_scales = {}
        self._used_float = set()
        self.indivisible = None
        self.calibration = {}
        self.fallbacks = []  # `Fallback`s, by weights written
        self.rounded = []  # `Rounded`s: the calibrated int4 weights

    def _int8_of(self, subgraph, index):
        """Buffer of the int8 rows of tensor `index`'s float buffer, and the
        scales (memoized per buffer: signatures share weights)."""
        tensor = subgraph.tensors[index]
        key = tensor.buffer
        if key not in self._int8:
            q, scale = self._rounded(tensor, self._float_weights(subgraph, index))
            self._int8[key] = (self._new_buffer(q), scale)
            self._used_float.add(key)
        return self._int8[key]

    def _rounded(self, tensor, weights, block=None, key=None):
        """`weights`' integers and scales, int4 in blocks of `block` (None:
        int8 rows), by GPTQ's rule on the product's calibration inputs
        where there are some (each noted in `rounded`), else to nearest;
        `key`: the weights' `weights_key` where the caller has it."""
        x = None
        if self.calibration:
            x = self.calibration.get(key or weights_key(weights))
        if x is None:
            return int8_rows(weights) if block is None else int4_blocks(weights, block)
        if block is None:
            q, scale, gptq = int8_rounding(weights, x)
        else:
            q, scale, gptq = int4_rounding(weights, x, block)
        bits = 8 if block is None else 4
        name = tensor.name.decode()
        self.rounded.append(Rounded(name, weights.shape, len(x), gptq, bits))
        return q, scale

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
            content = weights_key(weights)
            keras = self.known.get(content)
            if keras is None:
                # The caller's int8 products (`Calibration.int8`): int8 per row.
                int8 = content in getattr(self.calibration, "int8", ())
                block = None if int8 else self._block_for(tensor, weights)
                if block is None:
                    self._int4[key] = None
                    return None
                q, scale = self._rounded(tensor, weights, block, content)
                zero = None
            else:
                block = keras.file_block
                q, scale, zero = keras_int4_blocks(keras, block)
            self._int4[key] = Int4Entry(
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
        """Tensor `index` as int4 blocks; its `Int4Entry`, or None where no
        block divides its input (then int8 per row, dynamic range)."""
        tensor = subgraph.tensors[index]
        entry = self._int4_of(subgraph, index)
        if entry is None:
            self._set_int8(subgraph, index)
            return None
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

    def _block_for(self, tensor, weights):
        """The block `tensor`'s weights are written in: `block_size` where it
        divides their input dimension; else (without `indivisible`, the
        caller's refusal) the largest of the row's smaller block sizes
        that does, or None (int8 per row), each fallback noted in
        `fallbacks`."""
        columns = weights.shape[1]
        if columns % self.block_size == 0:
            return self.block_size
        name, shape = tensor.name.decode(), tuple(weights.shape)
        if self.indivisible is not None:
            raise ValueError(
                self.indivisible.format(name=name, shape=shape, block=self.block_size)
            )
        smaller = [b for b in self.row.block_sizes if b < self.block_size]
        block = next(
            (b for b in sorted(smaller, reverse=True) if columns % b == 0), None
        )
        self.fallbacks.append(
            Fallback(name, shape, self.block_size, "int8" if block is None else block)
        )
        return block

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
            if entry is None and op.builtinOptions is not None:
                op.builtinOptions.asymmetricQuantizeInputs = True
            elif entry is not None and entry.keras is not None:
                zeros.append((op, entry))
        elif products == INT8_DYNAMIC:
            self._set_int8(subgraph, index)
            if op.builtinOptions is not None:
                op.builtinOptions.asymmetricQuantizeInputs = True
