"""The quantize modes, one table: every policy of a mode is read from `MODES`.

A `Mode` says what the parity check bounds (`criterion`), how tightly by
default (`tolerance`), whether the mode calibrates activations on
`representative_data` (and so needs a loop-free graph), and what the TFLite
converter is asked for. No other module names a mode to decide its policy.

Why each check: float32 and float16 files (float16 rounds weights only,
steps of 2^-11) have small, bounded errors, so the worst sample is checked
(`"max"`, max |file - keras| / max |keras|). Dynamic-range, int8 and int16x8
files round weights or activations to a grid: their worst error over n
samples is a tail that keeps growing with n, while the root mean square of
the error against that of the output settles (`"rms"`). The bounds sit
between a correct file and one with a kernel perturbed by 5-10% of its
largest entry, on trained digit classifiers and LayerNormLSTM(32) models
(docs/design.md, "Parity tolerances"); an output int8 cannot resolve (an
untrained 1000-way softmax) gives an rms error near 1.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mode:
    """One quantize mode's policy.

    `weights` is the type the converter stores weights in (None: float32);
    `calibrates` a full-integer mode (activations calibrated, loops
    unrolled, `representative_data` required); `int16_activations` the
    16x8 quantizer; `fast_int8` the mode whose default file is the float32
    file quantized with XNNPACK's unsupported ops kept in float
    (`tflite.selective`), `int8_io=True` giving the converter's file;
    `smooths` a mode whose int8 activations `smooth` helps
    (`fold.smooth`).
    """

    name: str | None
    criterion: str
    tolerance: float
    weights: str | None = None
    calibrates: bool = False
    int16_activations: bool = False
    fast_int8: bool = False
    smooths: bool = False

    @property
    def optimizes(self):
        """Whether the converter quantizes at all (`Optimize.DEFAULT`)."""
        return self.name is not None

    def uses(self, option):
        """Whether a file of this mode has a use for `option`, when one
        value is given to several files at once (`options_for_file`, the
        command line): `int8_io` is the fast int8 mode's, `progress` a
        calibrating mode's, `export_dtype` the float file's (a quantized
        file stores the types of its mode); every other option, each's."""
        decided = {
            "int8_io": self.fast_int8,
            "progress": self.calibrates,
            "export_dtype": not self.optimizes,
            "smooth": self.smooths,
        }
        return decided.get(option, True)


MODES = {
    mode.name: mode
    for mode in (
        Mode(None, "max", 1e-4),
        Mode("float16", "max", 1e-2, weights="float16"),
        Mode("dynamic", "rms", 0.05, weights="int8", smooths=True),
        Mode(
            "int8",
            "rms",
            0.1,
            weights="int8",
            calibrates=True,
            fast_int8=True,
            smooths=True,
        ),
        Mode(
            "int16x8",
            "rms",
            0.05,
            weights="int8",
            calibrates=True,
            int16_activations=True,
        ),
    )
}
QUANTIZE_MODES = tuple(MODES)
# What `verify` and the docs name: the default tolerance of each mode.
DEFAULT_TOLERANCE = {name: mode.tolerance for name, mode in MODES.items()}
EXPORT_DTYPES = ("float32", "float16")
# Samples of representative_data that calibrate a full-integer mode by
# default, and time steps that calibrate a fast int8 streaming step, whose
# int8 matmul inputs need a few thousand (`tflite.step_int8` says why).
CALIBRATION_SAMPLES = 200
CALIBRATION_STEPS = 4000
# The longest sequence a full-integer export unrolls by default. An unrolled
# layer holds one copy of its cell per step: converter time and file size
# grow linearly with the length (docs/design.md has the figures).
MAX_UNROLL_STEPS = 64
