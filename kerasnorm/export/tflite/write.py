"""Stage 2 for TFLite: the prepared model (or its streaming step) converted
to `.tflite` bytes."""

from __future__ import annotations

from kerasnorm.export import litert
from kerasnorm.export._common.errors import ExportConversionError
from kerasnorm.export.streaming.step import concrete_step
from kerasnorm.export.tflite.explain import explain
from kerasnorm.export.tflite.int16 import refuse_zero_scales
from kerasnorm.export.tflite.int16 import square_as_mul
from kerasnorm.export.tflite.options import converter_options


def write_tflite(prepared, *, quantize, int8_io, batch_size, progress, verbose):
    """The `.tflite` bytes of `prepared.exported`: the whole model, or with
    `prepared.step` one time step; signature named by `prepared`."""
    kwargs = converter_options(
        quantize,
        int8_io,
        prepared.calibration,
        batch_size=batch_size,
        progress=progress,
    )
    model = prepared.exported
    try:
        if prepared.streaming:
            function = concrete_step(prepared.step, batch_size)
        else:
            function = litert.concrete_function(
                model,
                batch_size,
                names=(prepared.input_names, prepared.output_names),
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
    refuse_zero_scales(content, quantize)
    return content
