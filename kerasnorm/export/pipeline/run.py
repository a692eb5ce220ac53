"""The one export run: prepare, write to a staged path, verify, move into
place. The door (`pipeline.door.export`) builds the `ExportOptions` (every
refusal) and calls `run_export` with the format's writer."""

from __future__ import annotations

from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.pipeline.result import ExportResult
from kerasnorm.export.prepare.stage import prepare
from kerasnorm.export.prepare.weights import merged_lora
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged
from kerasnorm.export.verify.half import with_half_precision_hint
from kerasnorm.export.verify.single_value import with_single_value_hint
from kerasnorm.export.verify.verifier import verify_export


def run_export(model, options, target, write):
    """The `ExportResult` of exporting `model` with `options` to `target`.

    `write(prepared, tmp)` writes the artifact to the staged path `tmp` (laid
    out as `options.format` says: a directory or a file with its suffix)
    and returns the op types it computes in float
    (`ExportResult.float_ops`). Nothing is left at `target` unless the
    artifact verified."""
    refuse_existing(target, options.overwrite)
    if options.format.for_model is not None:
        options = options.format.load("for_model")(model, options)
    prepared = prepare(model, options)
    try:
        check, original, float_ops = _write_and_verify(prepared, options, target, write)
    finally:
        if prepared.restore is not None:
            prepared.restore()
    rebuild = prepared.rebuild
    return ExportResult(
        path=target,
        quantize=options.file_quantize,
        fold_report=prepared.fold_report,
        verification=check,
        rebuilt_from=None if rebuild is None else rebuild.policy,
        original_verification=original,
        unrolled=prepared.unrolled,
        float_ops=float_ops,
        smoothed=prepared.smoothed,
    )


def _write_and_verify(prepared, options, target, write):
    layout = options.format
    verify = verify_export if layout.verifier is None else layout.load("verifier")
    with staged(
        target, directory=layout.is_directory, suffix=layout.staged_suffix
    ) as tmp:
        # LoRA adapters merged into their kernels while the file is
        # written; verified below against the model as it computes.
        with merged_lora(prepared.exported):
            float_ops = write(prepared, tmp)
        try:
            check, original = verify(prepared, tmp, label=target)
        except ExportVerificationError as err:
            # A half-precision file: which constants float16 rounded most;
            # a quantized one: which norms normalize a single value, and
            # where the error enters.
            hinted = with_half_precision_hint(err, prepared, tmp)
            hinted = with_single_value_hint(hinted, prepared)
            if layout.failure_hint is not None:
                hinted = layout.load("failure_hint")(hinted, prepared, tmp)
            if hinted is err:
                raise
            raise hinted from err
    return check, original, float_ops
