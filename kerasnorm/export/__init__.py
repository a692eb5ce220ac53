"""Export: BatchNorm folding, SavedModel for TF Serving, TFLite, parity checks.

- `fold_batchnorm(model)`: a copy of the model with BatchNorm merged into the
  adjacent linear layers (docs/design.md §4), with a `FoldReport` of what was left,
  checked against the original (`FoldVerificationError` if it differs).
- `to_saved_model(model, path)`: `<path>/<version>/` with a `serving_default`
  signature, verified against the Keras model.
- `to_tflite(model, path, quantize=None|"float16"|"dynamic"|"int8"|"int16x8")`:
  a builtin-ops `.tflite`, verified with the LiteRT interpreter; the
  full-integer modes unroll rolled recurrent layers (`MAX_UNROLL_STEPS`).
- `streaming=True` on both: one time step of a sequence model per call, the
  recurrent states as named inputs and outputs (`litert.StreamingRunner`).
- `verify(model, artifact)`: errors, op counts, size and latency of an export.
- `quantize_aware(model)`: a tensorflow-model-optimization QAT copy of a
  `tf_keras` or Keras 3 model (`to_tf_keras` rebuilds the latter), which
  `to_tflite(..., quantize="int8")` turns into a real int8 file (`qat`
  extra; docs/qat.md).
- `litert`: the conversion and LiteRT runner under `to_tflite` and `verify`
  (`litert.convert`, `litert.Runner`, `litert.op_names`, ...), for running
  `.tflite` files from Python.

Every export is written to a temporary path, verified, and only then moved
into place; existing files are replaced only with `overwrite=True`.
"""

from kerasnorm._core.dependencies import require_tensorflow

require_tensorflow("kerasnorm.export")

from kerasnorm.export import litert
from kerasnorm.export._artifacts import ExportConversionError
from kerasnorm.export._artifacts import ExportResult
from kerasnorm.export._artifacts import ExportVerificationError
from kerasnorm.export._fold_report import FoldedBN
from kerasnorm.export._fold_report import FoldReport
from kerasnorm.export._fold_report import FoldVerificationError
from kerasnorm.export._fold_report import KeptBN
from kerasnorm.export._folding import fold_batchnorm
from kerasnorm.export._parity import DEFAULT_TOLERANCE
from kerasnorm.export._parity import Verification
from kerasnorm.export._qat import BRIDGED_LAYERS
from kerasnorm.export._qat import quantize_aware
from kerasnorm.export._qat import to_tf_keras
from kerasnorm.export._saved_model import to_saved_model
from kerasnorm.export._tflite import QUANTIZE_MODES
from kerasnorm.export._tflite import VERIFY_SAMPLES
from kerasnorm.export._tflite import to_tflite
from kerasnorm.export._unroll import MAX_UNROLL_STEPS
from kerasnorm.export._verify import verify

__all__ = [
    "BRIDGED_LAYERS",
    "DEFAULT_TOLERANCE",
    "MAX_UNROLL_STEPS",
    "QUANTIZE_MODES",
    "VERIFY_SAMPLES",
    "ExportConversionError",
    "ExportResult",
    "ExportVerificationError",
    "FoldReport",
    "FoldVerificationError",
    "FoldedBN",
    "KeptBN",
    "Verification",
    "fold_batchnorm",
    "litert",
    "quantize_aware",
    "to_saved_model",
    "to_tf_keras",
    "to_tflite",
    "verify",
]
