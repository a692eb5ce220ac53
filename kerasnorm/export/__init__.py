"""Export: BatchNorm folding, SavedModel for TF Serving, TFLite, parity checks.

- `fold_batchnorm(model)`: a copy of the model with BatchNorm merged into the
  adjacent linear layers (SPEC.md §4), with a `FoldReport` of what was left.
"""

from kerasnorm.export._folding import FoldedBN
from kerasnorm.export._folding import FoldReport
from kerasnorm.export._folding import KeptBN
from kerasnorm.export._folding import fold_batchnorm

__all__ = ["FoldReport", "FoldedBN", "KeptBN", "fold_batchnorm"]
