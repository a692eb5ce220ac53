"""`fold_batchnorm` and its report (`fold.batchnorm` says how it is done)."""

from kerasnorm.export.fold.batchnorm import fold_batchnorm
from kerasnorm.export.fold.report import FoldedAffine
from kerasnorm.export.fold.report import FoldedBN
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.fold.report import FoldVerificationError
from kerasnorm.export.fold.report import KeptBN

__all__ = [
    "FoldReport",
    "FoldVerificationError",
    "FoldedAffine",
    "FoldedBN",
    "KeptBN",
    "fold_batchnorm",
]
