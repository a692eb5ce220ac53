"""`ExportResult`, what an export returns, and the tolerances of its checks."""

from __future__ import annotations

import dataclasses

from kerasnorm.export._common.precision import compute_tolerance
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.verify.verification import Verification


@dataclasses.dataclass
class ExportResult:
    """What `to_saved_model` / `to_tflite` wrote, and how it verified.

    For a model that computes in half precision, `rebuilt_from` is its dtype
    policy (`"mixed_float16"`, ...): the artifact was exported from a copy
    rebuilt in float32 (float16 with `export_dtype="float16"`), which
    `verification` compares it with; `original_verification` compares it with
    the original, within a tolerance for its compute dtype, on the same
    inputs. Both are set together, whole or streaming; both None else.
    """

    path: str
    kind: str
    quantize: str | None
    size_bytes: int
    fold_report: FoldReport | None
    verification: Verification | None
    rebuilt_from: str | None = None
    original_verification: Verification | None = None
    # The recurrent layers a full-integer export unrolled (`to_tflite`).
    unrolled: tuple[str, ...] = ()
    # The op types a fast int8 file (`quantize="int8"` without `int8_io`)
    # computes in float, sorted; () for every other file.
    float_ops: tuple[str, ...] = ()


def result(prepared, path, kind, quantize, size_bytes, check, original):
    rebuild = prepared.rebuild
    return ExportResult(
        path=path,
        kind=kind,
        quantize=quantize,
        size_bytes=size_bytes,
        fold_report=prepared.fold_report,
        verification=check,
        rebuilt_from=None if rebuild is None else rebuild.policy,
        original_verification=original,
        unrolled=prepared.unrolled,
    )


def copy_tolerance(prepared, tolerance, export_dtype):
    """The tolerance of the check against the exported copy: `tolerance`
    for a float32 copy, plus the copy's compute tolerance for a float16 one
    (the fold rounds its kernels to float16)."""
    if prepared.rebuild is None or export_dtype == "float32":
        return tolerance
    return tolerance + compute_tolerance(prepared.rebuild.copy)


def original_tolerance(prepared, tolerance):
    """The tolerance of the check against a rebuilt model's original: the
    copy's plus the original's `compute_tolerance` (the two errors add)."""
    if prepared.rebuild is None:
        return None
    return tolerance + prepared.rebuild.tolerance
