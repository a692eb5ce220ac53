"""Stage 2 for TFLite: the prepared model (or its streaming step) converted
to a `.tflite` file."""

from __future__ import annotations

import contextlib
import sys

from kerasnorm._compat import matmul_as_one_product
from kerasnorm._core import lowering
from kerasnorm._core.dependencies import require_litert
from kerasnorm.export.litert.convert import convert as litert_convert
from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.litert.convert import trace
from kerasnorm.export.litert.lowering import decoder_graph
from kerasnorm.export.model.op_layers import recording
from kerasnorm.export.options.modes import MODES
from kerasnorm.export.streaming.step import concrete_step
from kerasnorm.export.tflite.converter import calibration_feed
from kerasnorm.export.tflite.converter import converter_options
from kerasnorm.export.tflite.degenerate import refuse_self_squares
from kerasnorm.export.tflite.explain import explain
from kerasnorm.export.tflite.int16 import refuse_attention_masks
from kerasnorm.export.tflite.int16 import refuse_masks
from kerasnorm.export.tflite.int16 import refuse_zero_scales
from kerasnorm.export.tflite.int16 import square_as_mul
from kerasnorm.export.tflite.selective import quantize_selectively
from kerasnorm.export.tflite.step_int8 import quantize_step
from kerasnorm.export.verify.child import child
from kerasnorm.export.weights.keras_quantized import FILE_MODE
from kerasnorm.export.weights.keras_quantized import float_traced
from kerasnorm.export.weights.quantize import quantize_weights

# What a refusal suggests for the float model, instead of Keras' weights.
FLOAT_MODES = "quantize='dynamic' or 'int8'"
# Weights the pass rounds afresh (no Keras layer's own: a norm's gain
# folded in) whose input dimension the file's int4 block does not divide.
INDIVISIBLE = (
    "to_tflite: the weights {name!r} {shape} (rows, input) are not a Keras "
    "int4 layer's own (a norm's gain folded into them, or a layer Keras did "
    "not quantize), and int4 blocks of {block} do not divide their input "
    "dimension. Export with fold=False, or the model before quantizing it "
    "with quantize='dynamic'. Nothing was written."
)


def ready():
    """Before the conversion (the format row's `ready`): the file is
    checked by running it, with LiteRT, first in the process that runs
    every new file once (`verify.child`), started now so that its LiteRT
    import overlaps with the conversion."""
    require_litert("to_tflite")
    child()


def write_tflite(prepared, path):
    """Write the `.tflite` file of `prepared.exported` (the whole model, or
    with `prepared.step` one time step; signature named by `prepared`) to
    `path`; the op types it computes in float (a fast int8 file), sorted.

    The fast int8 file (`prepared.int8_writer`) is converted in float32,
    then quantized by `quantize_selectively`, or `quantize_step` with the
    recurrent state in float, on the same calibration feed the converter
    takes; a model Keras quantized (`ExportOptions.keras_weights`,
    `tflite.keras_weights`) is converted in float32 from its dequantized
    weights and written with Keras' integers (`weights.quantize`); every
    other file is the converter's own."""
    ops = {}
    content = convert(prepared, ops)
    if prepared.options.keras_weights is not None:
        mode = FILE_MODE[prepared.options.keras_weights]
        content = quantize_weights(
            content, mode, known=ops["known"], indivisible=INDIVISIBLE
        )
    float_ops = ()
    if prepared.int8_writer is not None:
        try:
            content, float_ops = _fast_int8(prepared, content)
        except Exception as err:
            raise _explained(prepared, err, ops.get("ops")) from err
    # A norm over one channel first: its zero-range tensors are named by
    # their cause.
    refuse_self_squares(content, ops.get("ops"), prepared.options.quantize)
    refuse_zero_scales(content, prepared.options.mode, ops.get("ops"))
    with open(path, "wb") as f:
        f.write(content)
    return float_ops


def float_twin(prepared):
    """The float32 `.tflite` bytes of the graph `prepared`'s quantized file
    is converted from (its tensors named as that file's), and the trace's
    `op_layers.OpLayers` naming the layer of each: what `verify.entry`
    compares a quantized file with, tensor by tensor."""
    recorded = {}
    content = convert(prepared, recorded, float_twin=True)
    return content, recorded["ops"]


def convert(prepared, recorded=None, float_twin=False):
    """The converter's `.tflite` bytes for `prepared` (float32 for a fast
    int8 file, which `_fast_int8` quantizes, and with `float_twin` for any
    mode: the file's graph, unquantized). The trace is recorded with the
    layers creating each op (`model.op_layers`, in `recorded["ops"]` when a
    dict is given), so that a failure names them (`explain`). A model Keras
    quantized is traced in float32 from its dequantized weights
    (`keras_quantized.float_traced`; its int4 weights in
    `recorded["known"]`), converted unquantized."""
    recorded = {} if recorded is None else recorded
    options = prepared.options
    keras_weights = options.keras_weights is not None
    float_file = prepared.int8_writer or float_twin or keras_weights
    mode = MODES[None] if float_file else options.mode
    kwargs = converter_options(prepared, mode)
    model = prepared.exported
    # The file's batch: None (dynamic) or fixed (`shapes.file_shapes`).
    batch_size = prepared.batch_size
    if options.mode.int16_activations:
        refuse_masks(model)
        refuse_attention_masks(model)
    try:
        graph = _file_graph(options.mode, prepared.int8_writer)
        dequantized = (
            float_traced(model, "to_tflite", FLOAT_MODES)
            if keras_weights
            else contextlib.nullcontext()
        )
        with recording(model) as recorded["ops"], graph, dequantized as known:
            recorded["known"] = known
            if prepared.streaming:
                function = concrete_step(prepared.step, batch_size)
            else:
                function = trace(
                    model,
                    prepared.inputs,
                    (list(prepared.inputs.names), prepared.output_names),
                    prepared.shapes,
                    recurrent=prepared.facts.recurrent,
                )
        if options.mode.int16_activations:
            function = square_as_mul(function)
        return litert_convert(
            model, function=function, verbose=options.verbose, **kwargs
        )
    except Exception as err:
        raise _explained(prepared, err, recorded.get("ops")) from err


@contextlib.contextmanager
def _file_graph(mode, int8_writer=None):
    """Every file traces a `Dense` on tokens as one `FULLY_CONNECTED`, at a
    dynamic dimension too (`_compat.matmul_as_one_product`); a float32 file
    also traces the norms' float32 `.tflite` graph (`_core.lowering`), the
    selectively quantized int8 file GroupNorm's statistics in channel space
    (`lowering.int8_tflite`), and every other mode keeps the core's, whose
    statistics ops the quantizers find. Every file traces keras-hub's
    decoders in builtin ops (`litert.lowering.decoder_graph`), a float32
    file with their masks as additive biases too."""
    if int8_writer == "selective":
        norms = lowering.int8_tflite()
    elif mode.name is None:
        norms = lowering.float32_tflite()
    else:
        norms = contextlib.nullcontext()
    with matmul_as_one_product(), decoder_graph(mode.name is None), norms:
        yield


def _fast_int8(prepared, content):
    options = prepared.options
    feed = calibration_feed(
        prepared.calibration, prepared.batch_size or 1, options.progress, mode="int8"
    )
    quantize = {"step": quantize_step, "selective": quantize_selectively}[
        prepared.int8_writer
    ]
    # The calibrator logs as the converter does (TensorFlow's interpreter
    # deprecation warning, C++ lines): kept off the terminal the same way
    # unless `verbose`.
    with stderr_captured(not options.verbose):
        quantized = quantize(content, feed)
    return quantized.content, tuple(quantized.float_ops)


def _explained(prepared, err, ops):
    """`explain`'s error for a failed conversion or quantization of
    `prepared`; with `verbose` the converter's text is printed too (the
    message is one sentence, the text in its `details`)."""
    options = prepared.options
    explained = explain(
        prepared.exported,
        prepared.batch_size,
        err,
        ops=ops,
        quantize=options.quantize,
        what="the streaming step" if prepared.streaming else None,
    )
    if options.verbose and explained.details:
        print(f"The TFLite converter's output:\n{explained.details}", file=sys.stderr)
    return explained
