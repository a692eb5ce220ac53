"""Low-level TFLite conversion and LiteRT execution of Keras models.

`kerasnorm.export` builds its public functions on these; the tests use them to
check that every layer converts with builtin ops only.
"""

import numpy as np
import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm._compat import interpreter_ops


def input_signature(model, batch_size=1):
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
        specs.append(tf.TensorSpec(shape, tensor.dtype, name=f"input_{i}"))
    return specs


def concrete_function(model, batch_size=1):
    """The model's inference function traced at a fixed batch size."""
    specs = input_signature(model, batch_size)
    single = len(specs) == 1

    @tf.function(input_signature=specs)
    def serve(*args):
        return model(args[0] if single else list(args), training=False)

    return serve.get_concrete_function()


def convert(
    model,
    *,
    batch_size=1,
    builtins_only=True,
    optimizations=None,
    representative_dataset=None,
    supported_types=None,
    inference_input_type=None,
    inference_output_type=None,
    full_integer=False,
):
    """Convert a Keras model to TFLite flatbuffer bytes.

    With `builtins_only=True` conversion fails rather than fall back to Flex
    (select TF) ops, which most mobile runtimes do not ship.
    """
    # Keras 3 variables are not found by the converter's own freezing: left
    # alone they become VAR_HANDLE/READ_VARIABLE ops that read uninitialized
    # memory. Freezing them into constants first is what makes the file
    # self-contained.
    frozen = convert_variables_to_constants(concrete_function(model, batch_size))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen], model)
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if full_integer or (
        representative_dataset is not None and inference_input_type == tf.int8
    ):
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not builtins_only:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops
    if optimizations:
        converter.optimizations = list(optimizations)
    if supported_types:
        converter.target_spec.supported_types = list(supported_types)
    if representative_dataset is not None:
        converter.representative_dataset = representative_dataset
    if inference_input_type is not None:
        converter.inference_input_type = inference_input_type
    if inference_output_type is not None:
        converter.inference_output_type = inference_output_type
    return converter.convert()


def interpreter(content):
    """A LiteRT interpreter over flatbuffer bytes, tensors allocated."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content)
    interp.allocate_tensors()
    return interp


class Runner:
    """Calls a flatbuffer's signature with float arrays, one interpreter reused.

    Inputs are matched to the model's inputs by signature name (input_0, ...)
    and outputs are returned in signature order as a list of numpy arrays.
    Quantized (int8/uint8) inputs and outputs are converted with the tensor's
    scale and zero point, so callers always pass and get float arrays.
    """

    def __init__(self, content):
        self._runner = interpreter(content).get_signature_runner()
        self._inputs = self._runner.get_input_details()
        self._outputs = self._runner.get_output_details()

    @property
    def batch_size(self):
        return int(self._inputs["input_0"]["shape"][0])

    def __call__(self, inputs):
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feed = {}
        for i, value in enumerate(inputs):
            name = f"input_{i}"
            feed[name] = _quantize(np.asarray(value), self._inputs[name])
        result = self._runner(**feed)
        return [
            _dequantize(result[k], self._outputs[k])
            for k in sorted(result, key=_natural)
        ]

    def predict(self, inputs):
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


def run(content, inputs):
    """Run flatbuffer `content` once on `inputs` (an array or a list of arrays).

    See `Runner` for the input and output conventions.
    """
    return Runner(content)(inputs)


def op_counts(content):
    """How many times each operator occurs in a flatbuffer."""
    counts = {}
    for op in interpreter_ops(interpreter(content)):
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return dict(sorted(counts.items()))


def op_names(content):
    """The sorted set of operator names in a flatbuffer."""
    return sorted({op["op_name"] for op in interpreter_ops(interpreter(content))})


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
