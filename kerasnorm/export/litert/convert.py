"""`convert`: a Keras model as `.tflite` bytes, and the signature it gets."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile

import keras
import tensorflow as tf

from kerasnorm._compat import convert_variables_to_constants
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.inputs.shapes import model_file_shapes
from kerasnorm.export.model.facts import has_recurrent_layer
from kerasnorm.export.naming import names as _names
from kerasnorm.export.naming.names import SIGNATURE_KEY

# TFLite's 16x8 full-integer scheme: int16 activations, int8 weights.
_INT16X8 = tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8


def input_name(index: int) -> str:
    """The signature name of the model's `index`-th input when the model
    gives it no usable name (`signature_names` has the rule)."""
    return _names.fallback_input_name(index)


def signature_names(model) -> tuple[list[str], list[str]]:
    """`(inputs, outputs)`: the signature names of `model`'s inputs and
    outputs, in `keras.tree.flatten` order; the SavedModel and the `.tflite`
    file of `to_saved_model` / `to_tflite` use the same
    ([Signature names](../guides/export.md#signature-names) has the rule)."""
    return _names.input_names(model), _names.output_names(model)


def input_signature(model, batch_size: int | None = None, *, names=None, shapes=None):
    """`tf.TensorSpec`s for the model's inputs, in `model.inputs` order,
    named as `signature_names` says (or `names`): at `shapes` (one per
    input, None for a dynamic dimension), else the model's own shapes with
    the batch `batch_size` (None: dynamic; `shapes.file_shapes` has the
    rule, a recurrent layer's fixed batch included)."""
    spec = InputSpec.of(model)
    names = spec.names if names is None else names
    if shapes is None:
        shapes = model_file_shapes(model, spec, batch_size=batch_size)
    return _specs(spec, names, shapes)


def _specs(spec, names, shapes):
    return [
        tf.TensorSpec(shape, tensor.dtype, name=name)
        for tensor, name, shape in zip(spec.tensors, names, shapes, strict=True)
    ]


def concrete_function(model, batch_size: int | None = None, *, names=None, shapes=None):
    """The model's inference function traced at `input_signature(model,
    batch_size, shapes=shapes)` (`trace`, every fact looked up).

    It takes the inputs in `model.inputs` order and returns a dict of the
    outputs by signature name: `names` (`(inputs, outputs)`), else
    `signature_names(model)`.
    """
    names = signature_names(model) if names is None else names
    spec = InputSpec.of(model)
    if shapes is None:
        shapes = model_file_shapes(model, spec, batch_size=batch_size)
    return trace(model, spec, names, shapes, recurrent=has_recurrent_layer(model))


def trace(model, spec, names, shapes, *, recurrent):
    """The model's inference function at the signature of its inputs `spec`
    (`InputSpec`) at `shapes` (one per input, None for a dynamic
    dimension), named `names` (`(inputs, outputs)`): facts the caller has
    derived (`prepare`), `recurrent` whether the model holds a recurrent
    layer.

    At a fixed batch of 1 the model is traced at a dynamic batch inside
    the fixed signature: traced at batch 1, Keras' TensorFlow `add` takes a
    `(1, n, 1)` operand for a bias and writes an NCHW `BiasAdd` on a rank-3
    tensor, which the converter cannot lower (the residual `Conv1D(1, 1)(x)
    + inputs` of a one-channel series). A model with a recurrent layer is
    traced at its fixed batch itself: the converter lowers a loop's tensor
    lists only for a batch known inside the loop.
    """
    inputs_named, outputs_named = names
    specs = _specs(spec, inputs_named, shapes)

    def call(*args):
        outputs = keras.tree.flatten(model(spec.pack(args), training=False))
        return dict(zip(outputs_named, outputs, strict=True))

    inner = call
    if any(s.shape[0] == 1 for s in specs) and not recurrent:
        dynamic = [tf.TensorSpec((None, *s.shape[1:]), s.dtype) for s in specs]
        inner = tf.function(call).get_concrete_function(*dynamic)

    @tf.function(input_signature=specs)
    def serve(*args):
        return inner(*args)

    return serve.get_concrete_function()


def convert(
    model: keras.Model,
    *,
    batch_size: int | None = None,
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
    returning an iterator of `{signature input name: array}` dicts, arrays batch
    first (at `batch_size` when it is fixed; the calibrator resizes the
    file's dynamic dimensions to each sample's). `int16_activations` (with
    `full_integer`) selects TFLite's 16x8 scheme: int16 activations, int8
    weights. The converter's log (written by its C++ code to the process's
    stderr) is dropped unless `verbose=True`; conversion errors are raised
    as exceptions either way.
    `function`, a concrete function whose signature names its inputs and
    outputs, is converted instead of the model's own
    (`concrete_function(model, batch_size)`).
    """
    saved = tempfile.mkdtemp(prefix="kerasnorm-tflite-")
    try:
        with stderr_captured(not verbose):
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
def stderr_captured(capture):
    """Send everything written to stderr to a discarded file.

    The converter and the LiteRT runtime log from C++ straight to file
    descriptor 2 (some lines before absl's logging is even initialized, so no
    log level reaches them), and from Python through `warnings` and absl's
    logger: both the descriptor and `sys.stderr` are redirected. Exceptions
    are unaffected: they propagate, and are printed (if at all) after stderr
    is restored. A logging handler made inside (TensorFlow's logger makes
    its own on first use) writes to the real stderr afterwards.
    """
    if not capture:
        yield
        return
    # TensorFlow's logger makes its handler on first use, bound to the
    # `sys.stderr` of that moment: made inside, it would keep writing to the
    # sink after it is closed ("--- Logging error --- I/O operation on
    # closed file" at every later TensorFlow warning).
    tf.get_logger()
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
                _rebind_handlers(sink, sys.stderr)
    finally:
        os.close(saved)


def _rebind_handlers(sink, stream):
    """Point every logging handler created on `sink` (inside a capture) at
    `stream`: the sink is about to be closed."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if getattr(handler, "stream", None) is sink:
                handler.setStream(stream)
