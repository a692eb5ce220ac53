"""The export modes and their defaults, checked in one place."""

from __future__ import annotations

from kerasnorm._core import check_choice

QUANTIZE_MODES = (None, "float16", "dynamic", "int8", "int16x8")
# Full-integer modes: they calibrate activations and need loop-free graphs.
FULL_INTEGER_MODES = ("int8", "int16x8")
EXPORT_DTYPES = ("float32", "float16")
# Samples of representative_data that calibrate a full-integer mode by
# default (a streaming int8 step: `tflite.step_int8.CALIBRATION_STEPS`).
CALIBRATION_SAMPLES = 200
# Samples of representative_data the parity check runs when verify_inputs is
# None: enough that the check sees the tails of the int8 error, not only
# its typical size.
VERIFY_SAMPLES = 256
# Random samples a check runs on when it is given no inputs: more than a
# handful, so that one lucky draw does not decide; 32 instead of 8 cost no
# measurable time on small models (tracing and conversion dominate an
# export). Random inputs still say little about real data: the verification
# says "random" (`Verification.checked_on`).
RANDOM_SAMPLES = 32
# The longest sequence a full-integer export unrolls by default. An unrolled
# layer holds one copy of its cell per step: converter time grows linearly
# with the length (docs/design.md has the figures for a LayerNormLSTM(32)),
# and so does the file, since each copy keeps its own quantized constants.
MAX_UNROLL_STEPS = 64


def check_export_dtype(export_dtype):
    if export_dtype not in EXPORT_DTYPES:
        raise ValueError(
            f"export_dtype should be one of {EXPORT_DTYPES}. Received: "
            f"export_dtype={export_dtype!r}"
        )


def tflite_quantize(export_dtype, quantize):
    """The quantize mode `to_tflite` converts with for `export_dtype`."""
    check_export_dtype(export_dtype)
    check_choice(quantize, QUANTIZE_MODES, "quantize")
    if export_dtype == "float32":
        return quantize
    if quantize not in (None, "float16"):
        raise ValueError(
            'export_dtype="float16" writes a TFLite file with float16 weights '
            "(TFLite's builtin kernels have no float16 compute; GPU delegates "
            f"run such a file in float16), which quantize={quantize!r} "
            'replaces. Pass quantize=None or "float16" with it, or '
            'export_dtype="float32".'
        )
    return "float16"
