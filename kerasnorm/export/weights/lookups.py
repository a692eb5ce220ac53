"""Embedding lookups of a quantized table, as flatbuffer ops
(`weights.quantize`' pass): `GATHER(table, ids)` of a float table becomes
the gathered integer rows (less their blocks' gathered zero points, for
Keras' asymmetric int4) times their gathered scales; and Keras' int4 zero
points in a product, which LiteRT's block-wise int4 has no place for:
`FULLY_CONNECTED(x, W)` of Keras' asymmetric blocks becomes the int4
product less two small float ones (`int_weights.zero_point_products`).
(One module with the lookups: the package's import contract lists its
modules.)"""

from __future__ import annotations

import copy

import numpy as np

from kerasnorm.export.options.generative_modes import INT4_BLOCKS
from kerasnorm.export.weights.edits import Edits
from kerasnorm.export.weights.int_weights import int8_rows
from kerasnorm.export.weights.int_weights import zero_point_products


def _shape_options(schema, out_type):
    options = schema.ShapeOptionsT()
    options.outType = out_type
    return options


class Lookups(Edits):
    """The lookup and zero-point rewrites of `quantize._Quantizer` (which
    provides the tensors, buffers and ops they are built from)."""

    def _int4_table(self, subgraph, index):
        """The int4 blocks of tensor `index` (shared with a tied head's),
        and a float32 copy of their zero points (None: none) for the
        lookup. The lookup reads the blocks' float16 scales themselves
        (`_gather_int4`), the buffer a tied head's product reads: a float32
        copy would add 4 bytes per block to the file (1 MB for a
        32000 x 256 table in blocks of 32)."""
        key = subgraph.tensors[index].buffer
        entry = self._int4_of(subgraph, index)
        if key not in self._row_scales:
            zero = entry.zero
            self._row_scales[key] = (
                None if zero is None else self._new_buffer(zero.astype(np.float32))
            )
        return entry, self._row_scales[key]

    def _const_shape(self, subgraph, name, shape):
        values = np.asarray(shape, np.int32)
        return self._new_tensor(
            subgraph, name, values.shape, self.types.INT32, self._new_buffer(values)
        )

    def _gather_int4(self, subgraph, op):
        """`GATHER(table, ids)` of an int4 block table: the int4 rows
        dequantized (scale 1: their integers), times their blocks' scales."""
        table, ids = op.inputs[0], op.inputs[1]
        out = subgraph.tensors[op.outputs[0]]
        rows_count, width = subgraph.tensors[table].shape
        entry, zero_buffer = self._int4_table(subgraph, table)
        buffer, scale_shape, block = entry.buffer, entry.shape, entry.block
        name = subgraph.tensors[table].name
        unit = self.schema.QuantizationParametersT()
        unit.scale = np.ones(1, np.float32)
        unit.zeroPoint = np.zeros(1, np.int64)
        q_table = self._new_tensor(
            subgraph, name + b"_int4", (rows_count, width), self.types.INT4, buffer
        )
        subgraph.tensors[q_table].quantization = unit
        # The float16 scales, dequantized to float32 by an op of their own:
        # its input is a constant, so the interpreter computes it once, when
        # it prepares the graph, not per call.
        scales_16 = self._new_tensor(
            subgraph,
            name + b"_block_scales_f16",
            scale_shape,
            self.types.FLOAT16,
            entry.scales,
        )
        scales = self._new_tensor(
            subgraph, name + b"_block_scales", scale_shape, self.types.FLOAT32
        )
        shape = list(out.shape)
        blocks = width // block
        signature = None if out.shapeSignature is None else list(out.shapeSignature)
        lead_signature = None if signature is None else signature[:-1]
        # A dynamic lookup (a dimension -1 in the signature) splits its rows
        # into blocks over one flattened leading dimension, and takes its
        # output's shape from the rows' own (`SHAPE`): a fixed reshape would
        # hold the shape it was converted at.
        dynamic = lead_signature is not None and -1 in lead_signature
        lead = [-1] if dynamic else shape[:-1]
        lead_shape = [int(np.prod(shape[:-1]))] if dynamic else lead

        def new(suffix, last, dtype, gathered=False):
            """A tensor of the rows (`gathered`: as `GATHER` gives them,
            `(*ids, *last)`), else of their blocks `(lead, *last)`."""
            if gathered:
                dims, sig = [*shape[:-1], *last], signature
                sig = None if sig is None else [*lead_signature, *last]
            else:
                dims, sig = [*lead_shape, *last], [*lead, *last] if dynamic else None
            return self._new_tensor(subgraph, out.name + suffix, dims, dtype, 0, sig)

        rows_int4 = new(b"_int4", [width], self.types.INT4, gathered=True)
        subgraph.tensors[rows_int4].quantization = unit
        rows = new(b"_q", [width], self.types.FLOAT32, gathered=True)
        split = [*lead, blocks, block]
        rows_blocks = new(b"_blocks", [blocks, block], self.types.FLOAT32)
        row_scales = new(b"_scales", [blocks], self.types.FLOAT32, gathered=True)
        row_scales_1 = new(b"_scales1", [blocks, 1], self.types.FLOAT32)
        scaled = new(b"_scaled", [blocks, block], self.types.FLOAT32)
        kind, options = op.builtinOptionsType, op.builtinOptions
        position = subgraph.operators.index(op)

        def reshape(source, target, new_shape):
            return self._op(
                self.ops.RESHAPE,
                [source, self._const_shape(subgraph, b"shape", new_shape)],
                [target],
            )

        ops = [
            self._op(self.ops.DEQUANTIZE, [scales_16], [scales]),
            self._op(self.ops.GATHER, [q_table, ids], [rows_int4], kind, options),
            self._op(self.ops.DEQUANTIZE, [rows_int4], [rows]),
            self._op(self.ops.GATHER, [scales, ids], [row_scales], kind, options),
            reshape(rows, rows_blocks, split),
            reshape(row_scales, row_scales_1, [*lead, blocks, 1]),
        ]
        if zero_buffer is not None:
            # Keras' asymmetric blocks: each block's zero point off first.
            zeros = self._new_tensor(
                subgraph,
                name + b"_block_zeros",
                scale_shape,
                self.types.FLOAT32,
                zero_buffer,
            )
            row_zeros = new(b"_zeros", [blocks], self.types.FLOAT32, gathered=True)
            row_zeros_1 = new(b"_zeros1", [blocks, 1], self.types.FLOAT32)
            shifted = new(b"_shifted", [blocks, block], self.types.FLOAT32)
            ops += [
                self._op(self.ops.GATHER, [zeros, ids], [row_zeros], kind, options),
                reshape(row_zeros, row_zeros_1, [*lead, blocks, 1]),
                self._op(
                    self.ops.SUB,
                    [rows_blocks, row_zeros_1],
                    [shifted],
                    self.schema.BuiltinOptions.SubOptions,
                    self.schema.SubOptionsT(),
                ),
            ]
            rows_blocks = shifted
        ops.append(
            self._op(
                self.ops.MUL,
                [rows_blocks, row_scales_1],
                [scaled],
                self.schema.BuiltinOptions.MulOptions,
                self.schema.MulOptionsT(),
            )
        )
        if dynamic:
            out_shape = self._new_tensor(
                subgraph, out.name + b"_shape", [len(shape)], self.types.INT32
            )
            ops += [
                self._op(
                    self.ops.SHAPE,
                    [rows],
                    [out_shape],
                    self.schema.BuiltinOptions.ShapeOptions,
                    _shape_options(self.schema, self.types.INT32),
                ),
                self._op(self.ops.RESHAPE, [scaled, out_shape], [op.outputs[0]]),
            ]
        else:
            ops.append(reshape(scaled, op.outputs[0], shape))
        subgraph.operators[position : position + 1] = ops

    def _gather(self, subgraph, op):
        """`GATHER(table, ids)` as `CAST(GATHER(q, ids)) * GATHER(s, ids)`
        (int4: per block of the row)."""
        if (
            self.row.lookup == INT4_BLOCKS
            and self._int4_of(subgraph, op.inputs[0]) is not None
        ):
            return self._gather_int4(subgraph, op)
        table, ids = op.inputs[0], op.inputs[1]
        out = subgraph.tensors[op.outputs[0]]
        key = subgraph.tensors[table].buffer
        weights = self._float_weights(subgraph, table)
        if key not in self._int8:
            # Quantized here unless a tied head's FULLY_CONNECTED did.
            q, scale = int8_rows(weights)
            self._int8[key] = (self._new_buffer(q), scale)
            self._used_float.add(key)
        buffer, scale = self._int8[key]
        if key not in self._row_scales:
            self._row_scales[key] = self._new_buffer(scale.astype(np.float32))
        name = subgraph.tensors[table].name
        q_table = self._new_tensor(
            subgraph, name + b"_int8", weights.shape, self.types.INT8, buffer
        )
        scales = self._new_tensor(
            subgraph,
            name + b"_row_scales",
            (weights.shape[0], 1),
            self.types.FLOAT32,
            self._row_scales[key],
        )
        shape = list(out.shape)
        signature = None if out.shapeSignature is None else list(out.shapeSignature)
        rows_int8 = self._new_tensor(
            subgraph, out.name + b"_int8", shape, self.types.INT8, 0, signature
        )
        rows = self._new_tensor(
            subgraph, out.name + b"_float", shape, self.types.FLOAT32, 0, signature
        )
        one = [*shape[:-1], 1]
        one_signature = None if signature is None else [*signature[:-1], 1]
        row_scales = self._new_tensor(
            subgraph,
            out.name + b"_scale",
            one,
            self.types.FLOAT32,
            0,
            one_signature,
        )
        kind, options = op.builtinOptionsType, op.builtinOptions
        position = subgraph.operators.index(op)
        subgraph.operators[position : position + 1] = [
            self._op(self.ops.GATHER, [q_table, ids], [rows_int8], kind, options),
            self._op(self.ops.CAST, [rows_int8], [rows]),
            self._op(self.ops.GATHER, [scales, ids], [row_scales], kind, options),
            self._op(
                self.ops.MUL,
                [rows, row_scales],
                [op.outputs[0]],
                self.schema.BuiltinOptions.MulOptions,
                self.schema.MulOptionsT(),
            ),
        ]

    def _zero_points(self, subgraph, op, entry):
        """`y = FC(x, W)` of Keras' asymmetric int4 `W` as `FC(x, q * s) -
        FC(FC(x, E), Z)` (`zero_point_products`); the op's activation moves
        to the `SUB`."""
        if entry.products is None:
            indicator, zero = zero_point_products(entry.keras)
            entry.products = (self._new_buffer(indicator), self._new_buffer(zero))
            entry.product_shapes = (indicator.shape, zero.shape)
        out = subgraph.tensors[op.outputs[0]]
        shape = list(out.shape)
        signature = None if out.shapeSignature is None else list(out.shapeSignature)
        blocks = entry.product_shapes[0][0]

        def tensor(suffix, last, buffer=0, dims=None):
            dims = dims or [*shape[:-1], last]
            sig = None if signature is None else [*signature[:-1], last]
            return self._new_tensor(
                subgraph, out.name + suffix, dims, self.types.FLOAT32, buffer, sig
            )

        indicator = self._new_tensor(
            subgraph,
            out.name + b"_block_indicator",
            entry.product_shapes[0],
            self.types.FLOAT32,
            entry.products[0],
        )
        zero = self._new_tensor(
            subgraph,
            out.name + b"_block_zeros",
            entry.product_shapes[1],
            self.types.FLOAT32,
            entry.products[1],
        )
        product = tensor(b"_int4", shape[-1])
        sums = tensor(b"_block_sums", blocks)
        shift = tensor(b"_zero_shift", shape[-1])
        options = op.builtinOptions
        activation = 0 if options is None else options.fusedActivationFunction

        def plain():
            plain = copy.copy(options) or self.schema.FullyConnectedOptionsT()
            plain.fusedActivationFunction = 0
            plain.asymmetricQuantizeInputs = False
            return plain

        x = op.inputs[0]
        if options is not None:
            options.fusedActivationFunction = 0
        subtract = self.schema.SubOptionsT()
        subtract.fusedActivationFunction = activation
        kind = self.schema.BuiltinOptions.FullyConnectedOptions
        position = subgraph.operators.index(op)
        subgraph.operators[position + 1 : position + 1] = [
            self._op(
                self.ops.FULLY_CONNECTED, [x, indicator, -1], [sums], kind, plain()
            ),
            self._op(
                self.ops.FULLY_CONNECTED, [sums, zero, -1], [shift], kind, plain()
            ),
            self._op(
                self.ops.SUB,
                [product, shift],
                [op.outputs[0]],
                self.schema.BuiltinOptions.SubOptions,
                subtract,
            ),
        ]
        op.outputs = [product]
