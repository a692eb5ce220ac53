"""The one export run: prepare, write to a staged path, verify, move into
place. `to_tflite` and `to_saved_model` build their `ExportOptions` (every
refusal) and call `run_export` with their writer."""

from __future__ import annotations

from kerasnorm.export._common.errors import ExportVerificationError
from kerasnorm.export._common.staging import refuse_existing
from kerasnorm.export._common.staging import staged
from kerasnorm.export.pipeline.result import ExportResult
from kerasnorm.export.prepare.stage import prepare
from kerasnorm.export.verify.half import with_half_precision_hint
from kerasnorm.export.verify.verifier import verify_export


def run_export(model, options, target, write):
    """The `ExportResult` of exporting `model` with `options` to `target`.

    `write(prepared, tmp)` writes the artifact to the staged path `tmp` (a
    directory for a SavedModel, a `.tflite` file else) and returns the op
    types it computes in float (`ExportResult.float_ops`). Nothing is left
    at `target` unless the artifact verified."""
    refuse_existing(target, options.overwrite)
    prepared = prepare(model, options)
    try:
        check, original, float_ops = _write_and_verify(prepared, options, target, write)
    finally:
        if prepared.restore is not None:
            prepared.restore()
    rebuild = prepared.rebuild
    return ExportResult(
        path=target,
        quantize=options.quantize,
        fold_report=prepared.fold_report,
        verification=check,
        rebuilt_from=None if rebuild is None else rebuild.policy,
        original_verification=original,
        unrolled=prepared.unrolled,
        float_ops=float_ops,
        smoothed=prepared.smoothed,
    )


def _write_and_verify(prepared, options, target, write):
    directory = options.format == "saved_model"
    suffix = "" if directory else ".tflite"
    with staged(target, directory=directory, suffix=suffix) as tmp:
        float_ops = write(prepared, tmp)
        try:
            check, original = verify_export(prepared, tmp, label=target)
        except ExportVerificationError as err:
            # A half-precision file: which constants float16 rounded most.
            hinted = with_half_precision_hint(err, prepared, tmp)
            if hinted is err:
                raise
            raise hinted from err
    return check, original, float_ops
