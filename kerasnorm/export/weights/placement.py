"""Weights traced as signature inputs, written into the converted file as
constants: a flatbuffer rewrite (`place_weights`), as every other pass over
a `.tflite`'s ops lives in `weights/`.

`litert_lm.weight_inputs` traces each large weight as an input named
`PREFIX<k>` (so that LiteRT's converter never holds it). In the file the
converter writes, each such input reaches its readers through the ops the
converter put between them: `RESHAPE`s and `TRANSPOSE`s, then a `GATHER`
(an embedding table), a `FULLY_CONNECTED` (a tied head), or a
`BATCH_MATMUL` (a product whose right side is not constant). `place_weights`
replaces each input by a constant holding the variable's values with those
`RESHAPE`s and `TRANSPOSE`s applied in NumPy (the ops removed), and each
such `BATCH_MATMUL` by the `FULLY_CONNECTED` of the transposed matrix
(`keep_num_dims`: the same product, the one the converter writes for a
constant). The layout is never guessed from shapes: each transform is read
from the op that does it. A reader of any other kind, a weight input the
graph returns, or a shape that does not follow, raises `Unplaced`.
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm.export.weights.buffers import builtin_code
from kerasnorm.export.weights.buffers import opcode_index

# The name of weight `k`'s signature input: `PREFIX<k>`.
PREFIX = "kerasnorm_weight_"


class Unplaced(Exception):
    """The converted graph reads a weight input in a way `place_weights`
    does not write as a constant."""


def place_weights(model, schema, fu, weights, lazy=False):
    """Write `weights` (the Keras variables traced as inputs, in order) into
    `model` (a `ModelT` of `schema`; `fu`: LiteRT's `flatbuffer_utils`) as
    constants, in every signature; `Unplaced` where a reader is not one
    this writes. Each distinct (weight, transform) is one buffer, shared by
    the signatures. `lazy`: each buffer's data is a `Values`, computed
    where it is read, for a model written with its buffers after the
    flatbuffer (`buffers.write_model`); else a NumPy array. Returns the
    bytes of float32 weights written."""
    placer = _Placer(model, schema, fu, weights, lazy)
    for signature in model.signatureDefs:
        placer.signature(signature)
    return placer.written


class _Placer:
    def __init__(self, model, schema, fu, weights, lazy):
        self.model, self.schema, self.fu = model, schema, fu
        self.weights, self.lazy = weights, lazy
        self.last = {}  # the `Values` read last, and its bytes
        self.ops = schema.BuiltinOperator
        self.buffers = {}  # (weight index, transform) -> buffer index
        self.written = 0

    def _code(self, op):
        return builtin_code(self.model.operatorCodes[op.opcodeIndex])

    def _op_label(self, code):
        for name, value in vars(self.ops).items():
            if value == code and not name.startswith("_"):
                return name
        return str(code)

    def signature(self, signature):
        subgraph = self.model.subgraphs[signature.subgraphIndex]
        inputs = {}
        for entry in signature.inputs:
            name = entry.name.decode() if isinstance(entry.name, bytes) else entry.name
            if name.startswith(PREFIX):
                inputs[entry.tensorIndex] = int(name[len(PREFIX) :])
        if not inputs:
            return
        readers = {}
        for index, op in enumerate(subgraph.operators):
            for position, tensor in enumerate(op.inputs):
                readers.setdefault(tensor, []).append((index, position))
        outputs = set(subgraph.outputs)
        folded, replaced = set(), {}
        for tensor, k in inputs.items():
            self._check_input(subgraph, tensor, k)
            self._walk(subgraph, readers, outputs, tensor, k, (), folded, replaced)
        subgraph.operators = [
            replaced.get(index, op)
            for index, op in enumerate(subgraph.operators)
            if index not in folded
        ]
        subgraph.inputs = [t for t in subgraph.inputs if t not in inputs]
        signature.inputs = [e for e in signature.inputs if e.tensorIndex not in inputs]

    def _check_input(self, subgraph, tensor, k):
        shape = tuple(subgraph.tensors[tensor].shape)
        if k >= len(self.weights) or shape != tuple(self.weights[k].shape):
            raise Unplaced(f"weight input {PREFIX}{k} of shape {shape}")

    def _walk(self, subgraph, readers, outputs, tensor, k, steps, folded, replaced):
        """Follow weight `k`, transformed by `steps`, from `tensor` to its
        readers."""
        if tensor in outputs:
            raise Unplaced(f"the graph returns weight {PREFIX}{k}")
        for index, position in readers.get(tensor, []):
            op = subgraph.operators[index]
            code = self._code(op)
            if code in (self.ops.RESHAPE, self.ops.TRANSPOSE) and position == 0:
                step = self._step(subgraph, op, code, k)
                folded.add(index)
                self._walk(
                    subgraph,
                    readers,
                    outputs,
                    op.outputs[0],
                    k,
                    (*steps, step),
                    folded,
                    replaced,
                )
            elif (code == self.ops.GATHER and position == 0) or (
                code == self.ops.FULLY_CONNECTED and position == 1
            ):
                self._constant(subgraph.tensors[tensor], k, steps)
            elif code == self.ops.BATCH_MATMUL and position == 1:
                replaced[index] = self._fully_connected(subgraph, op, k, steps)
            else:
                raise Unplaced(
                    f"weight {PREFIX}{k} is read by {self._op_label(code)} "
                    f"(input {position})"
                )

    def _step(self, subgraph, op, code, k):
        """The NumPy transform `op` (a RESHAPE or TRANSPOSE of a weight)
        applies, as `(kind, argument)`."""
        out = subgraph.tensors[op.outputs[0]]
        shape = tuple(int(d) for d in out.shape)
        if out.shapeSignature is not None and any(d < 0 for d in out.shapeSignature):
            raise Unplaced(f"weight {PREFIX}{k} reshaped to a dynamic shape")
        if code == self.ops.RESHAPE:
            return ("reshape", shape)
        perm = self._constant_ints(subgraph, op.inputs[1])
        if perm is None:
            raise Unplaced(f"weight {PREFIX}{k} transposed by a computed perm")
        return ("transpose", perm)

    def _constant_ints(self, subgraph, index):
        if index < 0:
            return None
        tensor = subgraph.tensors[index]
        data = self.model.buffers[tensor.buffer].data
        if data is None or len(data) == 0:
            return None
        dtype = {
            self.schema.TensorType.INT32: np.int32,
            self.schema.TensorType.INT64: np.int64,
        }.get(tensor.type)
        if dtype is None:
            return None
        return tuple(int(p) for p in np.frombuffer(bytes(data), dtype))

    def _shape(self, k, steps):
        """The shape of weight `k` after `steps`."""
        shape = tuple(self.weights[k].shape)
        for kind, argument in steps:
            if kind == "reshape":
                if int(np.prod(argument)) != int(np.prod(shape)):
                    raise Unplaced(f"weight {PREFIX}{k} reshaped {shape} to {argument}")
                shape = argument
            else:
                if sorted(argument) != list(range(len(shape))):
                    raise Unplaced(f"weight {PREFIX}{k} transposed by {argument}")
                shape = tuple(shape[p] for p in argument)
        return shape

    def _simplified(self, k, steps):
        """`steps` without reshapes to the shape at hand, consecutive
        transposes as one, identity transposes dropped: a tied table read
        as it is and through two transposes is one buffer."""
        shape, simple = tuple(self.weights[k].shape), []
        for kind, argument in steps:
            if kind == "reshape":
                if argument != shape:
                    simple.append((kind, argument))
                shape = argument
                continue
            shape = tuple(shape[p] for p in argument)
            if simple and simple[-1][0] == "transpose":
                first = simple.pop()[1]
                argument = tuple(first[p] for p in argument)
            if argument != tuple(range(len(argument))):
                simple.append((kind, argument))
        return tuple(simple)

    def _buffer(self, k, steps):
        """The buffer of weight `k` after `steps` (one per pair)."""
        steps = self._simplified(k, steps)
        key = (k, steps)
        if key not in self.buffers:
            buffer = self.schema.BufferT()
            buffer.data = Values(self.weights[k], steps, self.last, key)
            if not self.lazy:
                buffer.data = np.asarray(buffer.data)
            self.model.buffers.append(buffer)
            self.buffers[key] = len(self.model.buffers) - 1
            self.written += len(buffer.data)
        return self.buffers[key]

    def _constant(self, tensor, k, steps):
        if tuple(tensor.shape) != self._shape(k, steps):
            raise Unplaced(
                f"weight {PREFIX}{k} read as {tuple(tensor.shape)}, "
                f"not {self._shape(k, steps)}"
            )
        if tensor.type != self.schema.TensorType.FLOAT32:
            raise Unplaced(f"weight {PREFIX}{k} read as type {tensor.type}")
        tensor.buffer = self._buffer(k, steps)

    def _fully_connected(self, subgraph, op, k, steps):
        """The `FULLY_CONNECTED` computing `op` (`BATCH_MATMUL(x, weight)`,
        weight `(in, out)`, or `(out, in)` adjoint): weights `(out, in)`,
        the leading dimensions kept."""
        options = op.builtinOptions
        shape = self._shape(k, steps)
        if len(shape) != 2 or getattr(options, "adjX", False):
            raise Unplaced(f"weight {PREFIX}{k} {shape} in a batched product")
        if not getattr(options, "adjY", False):
            steps += (("transpose", (1, 0)),)
            shape = shape[::-1]
        tensor = self.schema.TensorT()
        tensor.name = f"{PREFIX}{k}".encode()
        tensor.shape = list(shape)
        tensor.type = self.schema.TensorType.FLOAT32
        tensor.buffer = self._buffer(k, steps)
        subgraph.tensors.append(tensor)
        fc = self.schema.OperatorT()
        # Version 5: the first with `keep_num_dims`.
        fc.opcodeIndex = opcode_index(
            self.schema, self.fu, self.model, self.ops.FULLY_CONNECTED, version=5
        )
        fc.inputs = [op.inputs[0], len(subgraph.tensors) - 1, -1]
        fc.outputs = list(op.outputs)
        fc.builtinOptionsType = self.schema.BuiltinOptions.FullyConnectedOptions
        fc.builtinOptions = self.schema.FullyConnectedOptionsT()
        fc.builtinOptions.keepNumDims = True
        return fc


class Values:
    """A placed buffer's bytes (`uint8`), computed from its variable where
    they are read (`np.asarray`): the weights pass reads a weight a few
    times in a row and keeps its integers, so the float32 weights,
    transposed, are never all held at once beside the model's own. The
    last one computed is kept (`last`, shared by a model's `Values`) for
    the reads that follow."""

    def __init__(self, variable, steps, last, key):
        self.variable, self.steps, self.last = variable, steps, last
        # `last` names its `Values` by key, not by itself: a cycle would
        # keep the weight it holds until the garbage collector ran.
        self.key = key
        self.size = 4 * int(np.prod(variable.shape))

    def __len__(self):
        return self.size

    def __array__(self, dtype=None, copy=None):
        if self.last.get("of") != self.key:
            self.last.clear()  # the previous weight let go before this one
            self.last.update(of=self.key, data=self._computed())
        data = self.last["data"]
        return data if dtype is None else data.astype(dtype, copy=False)

    def _computed(self):
        values = np.asarray(keras.ops.convert_to_numpy(self.variable.value), np.float32)
        for kind, argument in self.steps:
            if kind == "reshape":
                values = values.reshape(argument)
            else:
                values = values.transpose(argument)
        return np.ascontiguousarray(values).reshape(-1).view(np.uint8)
