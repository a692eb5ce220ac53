"""`ExportResult`, what an export returns."""

from __future__ import annotations

import dataclasses

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

    `kind` and `size_bytes` are the verified artifact's (`verification.kind`,
    `.size_bytes`), kept here because they describe what was written.
    """

    path: str
    quantize: str | None
    fold_report: FoldReport | None
    verification: Verification
    rebuilt_from: str | None = None
    original_verification: Verification | None = None
    # The recurrent layers a full-integer export unrolled (`to_tflite`).
    unrolled: tuple[str, ...] = ()
    # The op types a fast int8 file (`quantize="int8"` without `int8_io`)
    # computes in float, sorted; () for every other file.
    float_ops: tuple[str, ...] = ()
    # The norms `smooth` rescaled (`fold.smooth.Smoothed`), in model order.
    smoothed: tuple = ()

    @property
    def kind(self) -> str:
        """ "tflite" or "saved_model": `verification.kind`."""
        return self.verification.kind

    @property
    def size_bytes(self) -> int:
        """The artifact's size on disk: `verification.size_bytes`."""
        return self.verification.size_bytes
