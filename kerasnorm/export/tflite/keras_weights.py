"""A model Keras quantized (`model.quantize("int8")`, `"int4"`) written by
`to_tflite` with its own integers and scales: the `.tflite` row's
`for_model` (`formats.Format`).

The converter cannot lower Keras' int8 products (an int8 operand of
`FULLY_CONNECTED`) and lowers its int4 ones to a file that computes
something else; and a file re-quantized from a float copy would hold other
integers than the model the user checked. So the model is traced in float32
from its exactly dequantized weights and its weights written back as Keras'
integers (`weights.keras_quantized`, as `to_litert_lm` writes them): an
int8 model is a `"dynamic"` file whose per-channel int8 weights are Keras'
(the pass recovers them exactly), an int4 model a file with Keras' int4
integers and scales in LiteRT's block-wise int4 (dynamic int8 activations
too). float8 has no LiteRT weights type XNNPACK runs, and is refused.

The quantize mode is the one that holds Keras' integers: `quantize=None`
(or `"dynamic"` for an int8 model, the same file) writes them; a mode that
would round the weights afresh (`"float16"`, `"int8"`, `"int16x8"`,
`"dynamic"` for an int4 model, `export_dtype="float16"`) or move them
(`smooth`) is refused by name. The file is verified against the quantized
model with `"dynamic"`'s criterion and tolerance (its activations are
rounded per call as a dynamic-range file's).
"""

from __future__ import annotations

import dataclasses

from kerasnorm.export.options.modes import MODES
from kerasnorm.export.tflite.write import FLOAT_MODES
from kerasnorm.export.weights.keras_quantized import FILE_MODE
from kerasnorm.export.weights.keras_quantized import keras_quantization

# Keras' weights type of each file mode (`FILE_MODE` read backwards).
_KERAS_MODE = {file_mode: keras_mode for keras_mode, file_mode in FILE_MODE.items()}
# What the user may ask for besides None, per Keras weights type.
_ALSO_ACCEPTED = {"int8": ("dynamic",), "int4": ()}


def keras_quantized_options(model, options):
    """`options` for `model`: unchanged unless Keras quantized it; then in
    the mode that holds its integers (`ExportOptions.keras_weights` says
    which), each conflicting option refused by name before anything is
    written."""
    file_mode = keras_quantization(model, "to_tflite", FLOAT_MODES)
    if file_mode is None:
        return options
    weights = _KERAS_MODE[file_mode]
    quantize = options.quantize
    if quantize is not None and quantize not in _ALSO_ACCEPTED[weights]:
        half = options.export_dtype == "float16"
        asked = 'export_dtype="float16"' if half else f"quantize={quantize!r}"
        accepted = " or ".join(["None", *map(repr, _ALSO_ACCEPTED[weights])])
        raise ValueError(
            f"to_tflite: {model.name!r} is quantized by Keras to {weights!r}, "
            f"and the file holds those integers and scales; {asked} would "
            f"round the weights afresh. Pass quantize={accepted} (the "
            "default writes Keras' own integers), or export the model before "
            "quantizing it. Nothing was written."
        )
    if options.smooth is not None:
        raise ValueError(
            f"to_tflite: {model.name!r} is quantized by Keras to {weights!r}; "
            "smooth would move channels into its integer weights. Leave "
            "smooth out, or smooth the float model before quantizing it. "
            "Nothing was written."
        )
    mode = MODES["dynamic"]
    return dataclasses.replace(
        options,
        quantize=mode.name,
        tolerance=options.tolerance if options.tolerance_given else mode.tolerance,
        keras_weights=weights,
    )
