"""Stage 2 for TFLite: the prepared model (or its streaming step) converted
to `.tflite` bytes."""

from __future__ import annotations

from kerasnorm.export import litert
from kerasnorm.export._common.errors import ExportConversionError
from kerasnorm.export._common.model import is_tf_keras_model
from kerasnorm.export.litert.convert import stderr_captured
from kerasnorm.export.streaming.step import concrete_step
from kerasnorm.export.tflite.explain import explain
from kerasnorm.export.tflite.int16 import refuse_zero_scales
from kerasnorm.export.tflite.int16 import square_as_mul
from kerasnorm.export.tflite.options import calibration_feed
from kerasnorm.export.tflite.options import converter_options
from kerasnorm.export.tflite.selective import quantize_selectively
from kerasnorm.export.tflite.step_int8 import quantize_step


def write_tflite(prepared, *, quantize, int8_io, progress, verbose):
    """`(content, float_ops)`: the `.tflite` bytes of `prepared.exported`
    (the whole model, or with `prepared.step` one time step; signature named
    by `prepared`, input shapes `prepared.shapes`) and the op types an int8
    file computes in float. A file with a dynamic batch calibrates one
    sample per batch.

    `quantize="int8"` without `int8_io` is the fast int8 file: converted in
    float32, then quantized by `quantize_selectively` (a streaming step or
    an unrolled recurrent model by `quantize_step`, its state in float) on
    the same calibration feed the converter takes; every other mode, and a
    `quantize_aware` model, is the converter's own."""
    # A quantization-aware model carries the ranges it trained with: the
    # converter's own int8 file uses them, a recalibration would not.
    selective = (
        quantize == "int8" and not int8_io and not is_tf_keras_model(prepared.exported)
    )
    batch_size = prepared.batch_size
    kwargs = converter_options(
        None if selective else quantize,
        int8_io,
        prepared.calibration,
        batch_size=batch_size or 1,
        progress=progress,
    )
    model = prepared.exported
    try:
        if prepared.streaming:
            function = concrete_step(prepared.step, batch_size)
        else:
            function = litert.concrete_function(
                model,
                names=(prepared.input_names, prepared.output_names),
                shapes=prepared.shapes,
            )
        if quantize == "int16x8":
            function = square_as_mul(function)
        content = litert.convert(model, function=function, verbose=verbose, **kwargs)
    except Exception as err:
        if prepared.streaming:
            raise ExportConversionError(
                f"TFLite conversion of the streaming step failed: {str(err)[:2000]}"
            ) from err
        raise explain(model, batch_size, err) from err
    float_ops = ()
    if selective:
        content, float_ops = _selective_int8(
            prepared, content, batch_size or 1, progress, verbose
        )
    refuse_zero_scales(content, quantize)
    return content, float_ops


def _selective_int8(prepared, content, batch_size, progress, verbose):
    feed = calibration_feed(prepared.calibration, batch_size, progress)
    # An unrolled recurrent layer carries its state from copy to copy of
    # the cell: int8 there rounds it at every step, as in a streaming step.
    recurrent = prepared.streaming or bool(prepared.unrolled)
    quantize = quantize_step if recurrent else quantize_selectively
    try:
        # The calibrator logs as the converter does (TensorFlow's
        # interpreter deprecation warning, C++ lines): kept off the terminal
        # the same way unless `verbose`.
        with stderr_captured(not verbose):
            quantized = quantize(content, feed)
    except Exception as err:
        raise ExportConversionError(
            f"int8 quantization of the converted float32 file failed: {str(err)[:2000]}"
        ) from err
    return quantized.content, tuple(quantized.float_ops)
