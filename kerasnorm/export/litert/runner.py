"""Running `.tflite` files: `Runner`, `StreamingRunner`, op listings."""

from __future__ import annotations

import numpy as np

from kerasnorm._compat import interpreter_ops
from kerasnorm._core.dependencies import require_litert
from kerasnorm.export.litert.allocated import Allocations
from kerasnorm.export.litert.convert import signature_names
from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.naming.names import FRAME
from kerasnorm.export.naming.names import SIGNATURE_KEY

# Samples per call of `Runner.predict` on a file with a dynamic batch.
PREDICT_BATCH = 32


def interpreter(content: bytes, delegated: bool = True):
    """A LiteRT interpreter over flatbuffer bytes, tensors allocated.
    `delegated=False`: LiteRT's built-in kernels alone, no XNNPACK."""
    # The first allocation in a process logs "Created TensorFlow Lite XNNPACK
    # delegate for CPU." from C++.
    with stderr_captured(True):
        interp = unallocated(content, delegated)
        interp.allocate_tensors()
    return interp


def unallocated(content, delegated=True):
    """An interpreter that only lists the file: allocating tensors would fail
    on Flex ops, which this runtime cannot run but `op_names` must report.
    `delegated=False`: LiteRT's built-in kernels alone, no XNNPACK."""
    require_litert("Running a .tflite file")
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_litert.interpreter import OpResolverType

    resolver = (
        OpResolverType.AUTO
        if delegated
        else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    with stderr_captured(True):
        return Interpreter(
            model_content=content, experimental_op_resolver_type=resolver
        )


class Runner:
    """Calls a flatbuffer's signature with float arrays, one interpreter reused.

    Inputs are matched by signature name: a dict by name, or a list (one
    array for a one-input file) in `input_names` order. Outputs come back as
    a list in `output_names` order. Both orders are the model's own
    (`model.inputs`, `keras.tree.flatten` of its outputs) when `model` is
    given, else the names' natural order (`input_0, input_1, ...`: the
    model's order for inputs and outputs it gives no names).
    Quantized (int8/uint8) inputs and outputs are converted with the
    tensor's scale and zero point, so callers always pass and get float
    arrays. A file's dynamic dimensions (`shape_signature` -1: the batch, a
    sequence length) take the size of the arrays given; its fixed ones must
    match (`input_shapes`). Each set of input shapes runs on an interpreter
    allocated once at those shapes (`litert.allocated` says why): a call at
    the shapes of an earlier one only sets, invokes and reads;
    `allocations` counts the interpreters allocated.

    Args:
        content: the flatbuffer's bytes, as `convert` returns them or as read
            from a `.tflite` file written by `to_tflite`.
        model: the Keras model the file was converted from, for its input
            and output order. Defaults to `None`.
    """

    def __init__(self, content: bytes, model=None):
        # Allocated at the file's own shapes: a file that cannot run fails
        # here (a Flex op), not at the first call.
        runner = interpreter(content).get_signature_runner(SIGNATURE_KEY)
        self._inputs = runner.get_input_details()
        self._outputs = runner.get_output_details()
        self._allocations = Allocations(content, self._inputs, self._outputs)
        if model is None:
            self.input_names = tuple(sorted(self._inputs, key=_natural))
            self.output_names = tuple(sorted(self._outputs, key=_natural))
        else:
            inputs, outputs = signature_names(model)
            self.input_names, self.output_names = tuple(inputs), tuple(outputs)
        unknown = set(self.input_names) ^ set(self._inputs)
        unknown |= set(self.output_names) ^ set(self._outputs)
        if unknown:
            raise ValueError(
                "The file's signature does not match the model's names: "
                f"{sorted(unknown)} (file: {sorted(self._inputs)} -> "
                f"{sorted(self._outputs)})."
            )

    @property
    def input_shapes(self) -> dict[str, tuple]:
        """Each input's shape by signature name, None where the file's
        dimension is dynamic."""
        return {name: signature_shape(d) for name, d in self._inputs.items()}

    @property
    def batch_size(self) -> int | None:
        """The file's fixed batch size, or None when the batch is dynamic."""
        return self.input_shapes[self.input_names[0]][0]

    def __call__(self, inputs) -> list[np.ndarray]:
        """Run one batch: exactly `batch_size` samples, any number when the
        batch is dynamic.

        Args:
            inputs: an array (one input), a list of arrays in `input_names`
                order, or a dict by signature name.
        """
        if not isinstance(inputs, dict):
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = dict(zip(self.input_names, inputs, strict=True))
        result = self.named(inputs)
        return [result[k] for k in self.output_names]

    def named(self, inputs: dict) -> dict[str, np.ndarray]:
        """Run one batch given as a dict by signature name; the outputs as a
        dict by signature name."""
        feed = {}
        for name, value in inputs.items():
            value = np.asarray(value)
            _check_shape(name, value.shape, self._inputs.get(name))
            feed[name] = _quantize(value, self._inputs[name])
        result = self._allocations.at(feed)(feed)
        return {k: _dequantize(v, self._outputs[k]) for k, v in result.items()}

    @property
    def allocations(self) -> int:
        """How many interpreters this runner allocated: one per set of input
        shapes it ran at (the last few are kept)."""
        return self._allocations.count

    def predict(self, inputs) -> list[np.ndarray]:
        """Run over many samples, `batch_size` at a time (`PREDICT_BATCH`
        when the batch is dynamic); outputs concatenated.

        A last partial batch of a fixed-batch file is padded with copies of
        its final sample and the padding is dropped from the outputs.
        """
        if isinstance(inputs, dict):
            inputs = [inputs[name] for name in self.input_names]
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        total, step = len(inputs[0]), self.batch_size
        if step is None:
            step = min(total, PREDICT_BATCH)
        chunks = []
        for start in range(0, total, step):
            batch = [np.asarray(x[start : start + step]) for x in inputs]
            short = step - len(batch[0])
            if short:
                batch = [
                    np.concatenate([x, np.repeat(x[-1:], short, 0)]) for x in batch
                ]
            chunks.append([y[: step - short] for y in self(batch)])
        return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


class StreamingRunner:
    """Runs a streaming step file (`to_tflite(..., streaming=True)`) one frame
    per call, carrying its recurrent states from call to call.

    States start at zero; `reset()` sets them back for a new stream.
    Quantized inputs, outputs and states are converted as in `Runner`, so the
    states are carried as float arrays. A step with a dynamic batch runs
    any number of streams side by side, on an interpreter allocated once
    per batch size (as `Runner`'s per set of shapes).

    Args:
        content: the flatbuffer's bytes.
    """

    def __init__(self, content: bytes):
        runner = interpreter(content).get_signature_runner(SIGNATURE_KEY)
        self._inputs = runner.get_input_details()
        self._outputs = runner.get_output_details()
        self._allocations = Allocations(content, self._inputs, self._outputs)
        self.state_names = tuple(
            sorted((n for n in self._inputs if n != FRAME), key=_natural)
        )
        self.output_names = tuple(
            sorted(
                (n for n in self._outputs if n not in self.state_names), key=_natural
            )
        )
        self.states = {}
        self.reset()

    @property
    def batch_size(self) -> int | None:
        """The file's fixed batch size: how many streams run side by side;
        None when it is dynamic (the first frame's batch, until `reset`)."""
        return signature_shape(self._inputs[FRAME])[0]

    def reset(self) -> None:
        """Zero every state: the next `step` starts a new stream. With a
        dynamic batch the states are made at the next frame's batch."""
        self.states = {}
        if self.batch_size is not None:
            self.states = self._zeros(self.batch_size)

    def _zeros(self, batch):
        return {
            n: np.zeros((batch, *self._inputs[n]["shape"][1:]), np.float32)
            for n in self.state_names
        }

    def step(self, frame) -> list[np.ndarray]:
        """One time step: `frame` is `(batch, features)`, or `(batch,)` token
        ids for a token model; the outputs in `output_names` order. The new
        states replace `states`."""
        frame = np.asarray(frame)
        expected = signature_shape(self._inputs[FRAME])
        fits = len(frame.shape) == len(expected) and all(
            e is None or e == d for e, d in zip(expected, frame.shape, strict=True)
        )
        batch = self._batch_of_states()
        if not fits or (batch is not None and len(frame) != batch):
            shape = (expected[0] if batch is None else batch, *expected[1:])
            layout = (
                "(batch_size, features)"
                if len(expected) > 1
                else "(batch_size,): one token id per stream"
            )
            raise ValueError(
                f"A frame of this stream has shape {shape}: {layout}"
                + (
                    "; the file's batch is dynamic, the stream's states hold "
                    f"{batch} until reset()"
                    if expected[0] is None and batch is not None
                    else ""
                )
                + f". Received shape {frame.shape}"
            )
        if not self.states:
            self.states = self._zeros(len(frame))
        feed = {FRAME: _quantize(frame, self._inputs[FRAME])}
        for name, state in self.states.items():
            feed[name] = _quantize(state, self._inputs[name])
        result = self._allocations.at(feed)(feed)
        self.states = {
            n: _dequantize(result[n], self._outputs[n]) for n in self.state_names
        }
        return [_dequantize(result[n], self._outputs[n]) for n in self.output_names]

    def _batch_of_states(self):
        if not self.states:
            return self.batch_size
        return len(next(iter(self.states.values())))

    def run(self, sequence) -> list[np.ndarray]:
        """`step` over every frame of `sequence` `(batch_size, time,
        features)` (token ids: `(batch_size, time)`), from the current
        states; each output stacked over time, `(batch_size, time, ...)`."""
        sequence = np.asarray(sequence)
        steps = [self.step(sequence[:, t]) for t in range(sequence.shape[1])]
        return [np.stack(parts, axis=1) for parts in zip(*steps, strict=True)]


def run(content: bytes, inputs) -> list[np.ndarray]:
    """Run flatbuffer `content` once on `inputs` (an array or a list of arrays).

    See `Runner` for the input and output conventions.
    """
    return Runner(content)(inputs)


def op_counts(content: bytes) -> dict[str, int]:
    """How many times each operator occurs in a flatbuffer."""
    counts = {}
    for op in interpreter_ops(unallocated(content)):
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return dict(sorted(counts.items()))


def op_names(content: bytes) -> list[str]:
    """The sorted set of operator names in a flatbuffer (`FlexX` for a Flex op)."""
    return sorted({op["op_name"] for op in interpreter_ops(unallocated(content))})


def signature_shape(detail) -> tuple:
    """A tensor's shape from its interpreter details, None where the file
    leaves the dimension dynamic (`shape_signature` -1)."""
    shape = detail.get("shape_signature")
    if shape is None or len(shape) != len(detail["shape"]):
        shape = detail["shape"]
    return tuple(None if int(d) < 0 else int(d) for d in shape)


def _check_shape(name, shape, detail):
    if detail is None:
        return  # the caller names the unknown input
    expected = signature_shape(detail)
    if len(shape) == len(expected) and all(
        e is None or e == d for e, d in zip(expected, shape, strict=True)
    ):
        return
    raise ValueError(
        f"Input {name!r} of this file has shape {expected} (None: any size, "
        f"the file is resized to the array's); received an array of shape "
        f"{tuple(shape)}."
    )


def _natural(name):
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1)


def _quantize(value, detail):
    dtype = detail["dtype"]
    scale, zero_point = detail["quantization"]
    # A scale of 0 marks a tensor that is not quantized: an integer input
    # (token ids, say) is passed as it is.
    if np.issubdtype(dtype, np.integer) and scale:
        value = np.round(value / scale + zero_point)
        info = np.iinfo(dtype)
        return np.clip(value, info.min, info.max).astype(dtype)
    return np.asarray(value).astype(dtype)


def _dequantize(value, detail):
    scale, zero_point = detail["quantization"]
    if np.issubdtype(detail["dtype"], np.integer) and scale:
        return (value.astype(np.float32) - zero_point) * scale
    return value
