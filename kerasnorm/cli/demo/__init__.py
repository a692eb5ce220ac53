"""`kerasnorm demo`: the library end to end on scikit-learn's digits.

Trains two models with XLA (`kerasnorm.training.compile(jit_compile=True)`)
on scikit-learn's bundled 8x8 digits (no download): a conv net with a
Conv+BatchNorm stem, GroupNorm, InstanceNorm, LayerNorm and pRMSNorm, and an
LN-LSTM that reads each digit as a sequence of its 8 rows. Each model is
saved as a `.keras` file and exported with `kerasnorm.export` (BatchNorm
folded) to a SavedModel and float32, float16 and int8 `.tflite` files, and
the conv net also to a quantization-aware-trained int8 `.tflite` when the
`qat` extra is installed. Every artifact is checked against the model it
came from on the held-out digits; one table per model (test accuracy, max
output difference, size, latency per call) is printed and written to
`report.json` and `report.md` in --out, which must be empty (or --force).
Exit status: 0 done, 1 an artifact failed its parity check, 2 bad arguments
or a non-empty --out without --force (nothing written), 3 the converter
failed.

Its arguments are parsed and checked in `kerasnorm_cli` (the command's
front). The package holds one stage per module: `data` (the digits), `models` (the
two networks), `run` (training, export and verification of each model) and
`report` (the tables and the report files).
"""

from kerasnorm.cli.demo.data import load_digits
from kerasnorm.cli.demo.models import build_lstm_model
from kerasnorm.cli.demo.models import build_model
from kerasnorm.cli.demo.run import run_demo

__all__ = ["build_lstm_model", "build_model", "load_digits", "run_demo"]
