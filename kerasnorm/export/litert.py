"""TFLite conversion and LiteRT execution of Keras models.

The building blocks under `to_tflite` and `verify`, public for code that runs
`.tflite` files from Python (benchmarks, accuracy checks, layer tests):

- `convert(model, ...)`: flatbuffer bytes with one `serving_default`
  signature (inputs `input_0, input_1, ...` in `model.inputs` order, outputs
  `output_0, ...` in `keras.tree.flatten` order), builtin ops only, variables
  frozen into constants. No parity check: `to_tflite` adds that.
- `Runner(content)`: calls the signature with float arrays, quantizing and
  dequantizing int8 inputs/outputs; `Runner.predict` batches many samples.
- `StreamingRunner(content)`: runs a streaming step file (`to_tflite(...,
  streaming=True)`) one frame per `step`, carrying the states; `reset()`.
- `run(content, inputs)`, `op_counts(content)`, `op_names(content)`.

```
from kerasnorm.export import litert

content = litert.convert(model)
outputs = litert.Runner(content).predict(x)  # a list, one array per output
assert not any(op.startswith("Flex") for op in litert.op_names(content))
```
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm._compat import interpreter_ops

__all__ = [
    "FRAME",
    "SIGNATURE_KEY",
    "Runner",
    "StreamingRunner",
    "concrete_function",
    "convert",
    "input_name",
    "input_signature",
    "interpreter",
    "op_counts",
    "op_names",
    "run",
]

SIGNATURE_KEY = "serving_default"
# The frame input of a streaming step (`to_tflite(..., streaming=True)`); its
# other inputs are states named `state_<layer>_<i>`, returned under the same
# names next to the outputs `output_<i>`.
FRAME = "x"
STATE_PREFIX = "state_"
# TFLite's 16x8 full-integer scheme: int16 activations, int8 weights.
_INT16X8 = tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8


def input_name(index: int) -> str:
    """The signature name of the model's `index`-th input."""
    return f"input_{index}"


def input_signature(model: keras.Model, batch_size: int = 1) -> list:
    """Fixed-batch `tf.TensorSpec`s for the model's inputs, named input_0...

    Raises ValueError when a non-batch dimension is undefined: TFLite needs
    static shapes for reliable builtin-only conversion.
    """
    specs = []
    for i, tensor in enumerate(model.inputs):
        shape = (batch_size, *tensor.shape[1:])
        if any(d is None for d in shape):
            raise ValueError(
                f"Model input {i} ({tensor.name!r}) has an undefined dimension: "
                f"{tuple(tensor.shape)}. Give the model a fixed input shape to "
                "export it to TFLite."
            )
        specs.append(tf.TensorSpec(shape, tensor.dtype, name=input_name(i)))
    return specs


def concrete_function(model: keras.Model, batch_size: int = 1):
    """The model's inference function traced at a fixed batch size.

    It returns the model's outputs flattened (`keras.tree.flatten`), so that
    the signature's outputs are `output_0, output_1, ...` in that order.
    """
    specs = input_signature(model, batch_size)
    single = len(specs) == 1

    @tf.function(input_signature=specs)
    def serve(*args):
        outputs = model(args[0] if single else list(args), training=False)
        return keras.tree.flatten(outputs)

    return serve.get_concrete_function()


def convert(
    model: keras.Model,
    *,
    batch_size: int = 1,
    builtins_only: bool = True,
    optimizations=None,
    representative_dataset=None,
    supported_types=None,
    inference_input_type=None,
    inference_output_type=None,
    full_integer: bool = False,
    int16_activations: bool = False,
    verbose: bool = False,
    function=None,
) -> bytes:
    """Convert a Keras model to TFLite flatbuffer bytes.

    With `builtins_only=True` conversion fails rather than fall back to Flex
    (select TF) ops, which most mobile runtimes do not ship.
    `representative_dataset` (for full-integer quantization) is a callable
    returning an iterator of `{input_name(i): array}` dicts, arrays batch
    first at `batch_size`. `int16_activations` (with `full_integer`) selects
    TFLite's 16x8 scheme: int16 activations, int8 weights. The converter's
    log (written by its C++ code to the process's stderr) is dropped unless
    `verbose=True`; conversion errors are raised as exceptions either way.
    `function`, a concrete function whose signature names its inputs and
    outputs, is converted instead of the model's own
    (`concrete_function(model, batch_size)`).
    """
    saved = tempfile.mkdtemp(prefix="kerasnorm-tflite-")
    try:
        with _stderr_captured(not verbose):
            # Keras 3 variables are not found by the converter's own freezing:
            # left alone they become VAR_HANDLE/READ_VARIABLE ops that read
            # uninitialized memory. Freezing them into constants first is what
            # makes the file self-contained. The freezing runs Grappler, which
            # logs from C++ too ("Number of eligible GPUs", "Starting new
            # session"), hence inside the capture.
            if function is None:
                function = concrete_function(model, batch_size)
            frozen = _output_names_kept(
                convert_variables_to_constants(function), function
            )
            # The converter keeps a signature only when it can lower the
            # function to a SavedModel; when its own save fails it silently
            # falls back to a path that writes no signature at all. The save
            # fails on frozen graphs with custom gradients (`swish`/`silu`):
            # the gradient function still captures the unfrozen variables.
            # Inference never needs gradients, so save without them, here,
            # where a failure is raised rather than swallowed.
            tf.saved_model.save(
                tf.Module(),
                saved,
                signatures={SIGNATURE_KEY: frozen},
                options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
            )
            converter = tf.lite.TFLiteConverter.from_saved_model(
                saved, signature_keys=[SIGNATURE_KEY]
            )
            _configure(
                converter,
                builtins_only=builtins_only,
                optimizations=optimizations,
                representative_dataset=representative_dataset,
                supported_types=supported_types,
                inference_input_type=inference_input_type,
                inference_output_type=inference_output_type,
                full_integer=full_integer,
                int16_activations=int16_activations,
            )
            return converter.convert()
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def _output_names_kept(frozen, function):
    """`frozen` returning `function`'s dict of named outputs again: freezing
    flattens a dict to a list (in sorted key order, as `tf.nest` does), which
    the converter would name `output_0, ...`."""
    structure = function.structured_outputs
    if not isinstance(structure, dict):
        return frozen
    names = sorted(structure)

    @tf.function(input_signature=list(function.structured_input_signature[0]))
    def named(*args):
        return dict(zip(names, frozen(*args), strict=True))

    return named.get_concrete_function()


def _configure(
    converter,
    *,
    builtins_only,
    optimizations,
    representative_dataset,
    supported_types,
    inference_input_type,
    inference_output_type,
    full_integer,
    int16_activations=False,
):
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if full_integer:
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if full_integer and int16_activations:
        ops = [_INT16X8]
    if not builtins_only:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops
    if optimizations:
        converter.optimizations = list(optimizations)
    if supported_types:
        converter.target_spec.supported_types = list(supported_types)
    if representative_dataset is not None:
        # The calibrator feeds a plain list by the position of the flatbuffer's
        # input tensors, whose order is not the signature's (two inputs come
        # out reversed); a (signature key, dict) sample is fed by name.
        converter.representative_dataset = lambda: (
            (SIGNATURE_KEY, feed) for feed in representative_dataset()
        )
    if inference_input_type is not None:
        converter.inference_input_type = inference_input_type
    if inference_output_type is not None:
        converter.inference_output_type = inference_output_type


@contextlib.contextmanager
def _stderr_captured(capture):
    """Send everything written to stderr to a discarded file.

    The converter and the LiteRT runtime log from C++ straight to file
    descriptor 2 (some lines before absl's logging is even initialized, so no
    log level reaches them), and from Python through `warnings` and absl's
    logger: both the descriptor and `sys.stderr` are redirected. Exceptions
    are unaffected: they propagate, and are printed (if at all) after stderr
    is restored.
    """
    if not capture:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile("w+") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                with contextlib.redirect_stderr(sink):
                    yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def interpreter(content: bytes):
    """A LiteRT interpreter over flatbuffer bytes, tensors allocated."""
    # The first allocation in a process logs "Created TensorFlow Lite XNNPACK
    # delegate for CPU." from C++.
    with _stderr_captured(True):
        interp = _unallocated(content)
        interp.allocate_tensors()
    return interp


def _unallocated(content):
    """An interpreter that only lists the file: allocating tensors would fail
    on Flex ops, which this runtime cannot run but `op_names` must report."""
    from ai_edge_litert.interpreter import Interpreter

    with _stderr_captured(True):
        return Interpreter(model_content=content)


class Runner:
    """Calls a flatbuffer's signature with float arrays, one interpreter reused.

    Inputs are matched to the model's inputs by signature name (input_0, ...)
    and outputs are returned in signature order as a list of numpy arrays.
    Quantized (int8/uint8) inputs and outputs are converted with the tensor's
    scale and zero point, so callers always pass and get float arrays.

    Args:
        content: the flatbuffer's bytes, as `convert` returns them or as read
            from a `.tflite` file written by `to_tflite`.
    """

    def __init__(self, content: bytes):
        self._runner = interpreter(content).get_signature_runner(SIGNATURE_KEY)
        self._inputs = self._runner.get_input_details()
        self._outputs = self._runner.get_output_details()

    @property
    def batch_size(self) -> int:
        """The file's fixed batch size."""
        return int(self._inputs[input_name(0)]["shape"][0])

    def __call__(self, inputs) -> list[np.ndarray]:
        """Run one batch of exactly `batch_size` samples.

        Args:
            inputs: an array (one input) or a list of arrays, in
                `model.inputs` order.
        """
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feed = {}
        for i, value in enumerate(inputs):
            name = input_name(i)
            feed[name] = _quantize(np.asarray(value), self._inputs[name])
        result = self._runner(**feed)
        return [
            _dequantize(result[k], self._outputs[k])
            for k in sorted(result, key=_natural)
        ]

    def predict(self, inputs) -> list[np.ndarray]:
        """Run over many samples, `batch_size` at a time; outputs concatenated.

        A last partial batch is padded with copies of its final sample and
        the padding is dropped from the outputs.
        """
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        total, step = len(inputs[0]), self.batch_size
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
    states are carried as float arrays.

    Args:
        content: the flatbuffer's bytes.
    """

    def __init__(self, content: bytes):
        self._runner = interpreter(content).get_signature_runner(SIGNATURE_KEY)
        self._inputs = self._runner.get_input_details()
        self._outputs = self._runner.get_output_details()
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
    def batch_size(self) -> int:
        """The file's fixed batch size: how many streams run side by side."""
        return int(self._inputs[FRAME]["shape"][0])

    def reset(self) -> None:
        """Zero every state: the next `step` starts a new stream."""
        self.states = {
            n: np.zeros(self._inputs[n]["shape"], np.float32) for n in self.state_names
        }

    def step(self, frame) -> list[np.ndarray]:
        """One time step: `frame` is `(batch_size, features)`; the outputs in
        `output_names` order. The new states replace `states`."""
        frame = np.asarray(frame)
        expected = tuple(int(d) for d in self._inputs[FRAME]["shape"])
        if frame.shape != expected:
            raise ValueError(
                f"A frame of this file has shape {expected}: (batch_size, "
                f"features). Received shape {frame.shape}"
            )
        feed = {FRAME: _quantize(frame, self._inputs[FRAME])}
        for name, state in self.states.items():
            feed[name] = _quantize(state, self._inputs[name])
        result = self._runner(**feed)
        self.states = {
            n: _dequantize(result[n], self._outputs[n]) for n in self.state_names
        }
        return [_dequantize(result[n], self._outputs[n]) for n in self.output_names]

    def run(self, sequence) -> list[np.ndarray]:
        """`step` over every frame of `sequence` `(batch_size, time,
        features)`, from the current states; each output stacked over time,
        `(batch_size, time, ...)`."""
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
    for op in interpreter_ops(_unallocated(content)):
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return dict(sorted(counts.items()))


def op_names(content: bytes) -> list[str]:
    """The sorted set of operator names in a flatbuffer (`FlexX` for a Flex op)."""
    return sorted({op["op_name"] for op in interpreter_ops(_unallocated(content))})


def _natural(name):
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1)


def _quantize(value, detail):
    dtype = detail["dtype"]
    if np.issubdtype(dtype, np.integer):
        scale, zero_point = detail["quantization"]
        value = np.round(value / scale + zero_point)
        info = np.iinfo(dtype)
        return np.clip(value, info.min, info.max).astype(dtype)
    return value.astype(dtype)


def _dequantize(value, detail):
    if np.issubdtype(detail["dtype"], np.integer):
        scale, zero_point = detail["quantization"]
        return (value.astype(np.float32) - zero_point) * scale
    return value
