"""What the export commands share (`kerasnorm export`, `kerasnorm qat`): the
artifact jobs and how they run, and the table they print."""

from __future__ import annotations

import dataclasses
import sys

RANDOM_INPUTS_HINT = (
    "Checked on random inputs, which say little about real data: pass "
    "--verify-data FILE.npy|.npz (held-out inputs) for a check that does."
)


@dataclasses.dataclass
class Job:
    """One artifact a command writes: its label in the table and the
    function that writes and verifies it."""

    label: str  # the artifact's path relative to --out
    export: object  # (model, calibration, verify_inputs) -> ExportResult


def export_all(command, jobs, model, calibration, verify_inputs, checked_on):
    """Run every job; (outcome, table rows). A failure stops no other job;
    the outcome is the first failure's (`kerasnorm.cli.OUTCOMES`).

    `checked_on` names where `verify_inputs` came from (a flag), or is None
    when there are none and the library checks on random inputs.
    """
    from kerasnorm import export

    # Most specific first: ExportConversionError is a ValueError. A
    # ValueError here is an argument only the model can judge (a
    # --max-unroll-steps shorter than its sequences, --streaming on a model
    # without a time axis): a refusal, as before any work.
    failures = [
        (export.ExportVerificationError, "FAILED parity", "parity"),
        (export.FoldVerificationError, "FAILED folding", "parity"),
        (export.ExportConversionError, "conversion failed", "conversion"),
        (ValueError, "error", "usage"),
        (OSError, "write failed", "conversion"),
    ]
    rows = []
    status = "ok"
    report_shown = False
    for job in jobs:
        try:
            result = job.export(model, calibration, verify_inputs)
        except tuple(kind for kind, _, _ in failures) as err:
            print(f"kerasnorm {command}: {job.label}: {err}", file=sys.stderr)
            _, text, code = next(f for f in failures if isinstance(err, f[0]))
            rows.append((job.label, "-", "-", "-", "-", "-", text))
            status = code if status == "ok" else status
            continue
        if hasattr(result, "draft_steps"):  # a base with its drafter
            print(_speculative_line(job.label, result))
            rows.append(_speculative_row(job.label, result))
            continue
        if isinstance(result, export.GenerativeExport):
            print(_generative_line(job.label, result))
            if result.model_type is not None:
                print(_bundle_line(job.label, result))
            rows.append(_generative_row(job.label, result, checked_on))
            continue
        if result.rebuilt_from is not None:
            print(_rebuild_line(job.label, result))
        if result.fold_report is not None and not report_shown:
            print(result.fold_report)
            report_shown = True
        if result.unrolled:
            print(
                f"{job.label}: unrolled recurrent layer(s) "
                f"{', '.join(result.unrolled)} for {result.quantize} "
                "(the user's model is unchanged)"
            )
        if result.verification.delegation is not None:
            print(_delegation_line(job.label, result))
        rows.append(_row(job.label, result, checked_on))
    return status, rows


def _delegation_line(label, result):
    """How the file runs on XNNPACK, and which ops a fast int8 file keeps
    in float: the first things an on-device engineer asks."""
    # Not starting with the label: the table's row does.
    line = f"XNNPACK, {label}: {result.verification.delegation}"
    if result.float_ops:
        line += (
            f"; int8 with {', '.join(result.float_ops)} in float "
            "(--int8-io for an integer-only file)"
        )
    return line


def _generative_line(label, result):
    """A generative file's signatures and cache, then how its decode step
    runs on XNNPACK."""
    line = (
        f"{label}: signatures {', '.join(result.signatures)}; "
        f"{result.num_layers} layers' caches {result.cache_shape}"
    )
    if result.delegation is not None:
        line += f"; XNNPACK, decode: {result.delegation}"
    return line


def _bundle_line(label, result):
    """A `.litertlm` bundle's chat metadata and its run in LiteRT-LM's
    engine (or why it was not run)."""
    stops = ", ".join(map(str, result.stop_tokens))
    return (
        f"{label}: model type {result.model_type}, {result.chat}; stop "
        f"tokens {stops}; {result.engine}"
    )


def _speculative_line(label, result):
    """A speculative bundle's base signatures and drafter, its chat
    metadata and its run in LiteRT-LM's engine (or why it was not run)."""
    stops = ", ".join(map(str, result.stop_tokens))
    return (
        f"{label}: signatures {', '.join(result.signatures)} and an MTP "
        f"drafter of {result.draft_steps} draft steps; model type "
        f"{result.model_type}; stop tokens {stops}; {result.check}; "
        f"{result.engine}"
    )


def _speculative_row(label, result):
    check, run = result.check, result.engine_run
    equal = "equal" if check.tokens_equal else "DIFFER"
    return (
        label,
        f"{result.size_bytes / 1024:.1f} KiB",
        "-",
        f"{check.max_error:.2e} max rel, greedy tokens {equal}",
        f"{check.prompts} prompts",
        "-" if run is None else f"{run.speculative_tokens_per_second:.1f} tok/s",
        "ok",
    )


def _generative_row(label, result, checked_on):
    check = result.check
    source = {
        "invented": "invented prompts",
        "tokenizer text": "prompts of text in its tokenizer",
    }.get(check.source, f"of {checked_on}")
    if result.quantize is None:
        error = f"{check.max_error:.2e} max rel, greedy tokens equal"
    else:
        error = f"{check.rms_error:.1e} rms rel, top-1 {check.agreement:.0%}"
    return (
        label,
        f"{result.size_bytes / 1024:.1f} KiB",
        str(sum(result.op_counts.values())),
        error,
        f"{check.prompts} prompts {source}",
        "-" if result.decode_ms is None else f"{result.decode_ms:.3f} ms decode",
        "ok",
    )


def _rebuild_line(label, result):
    line = (
        f"{label}: the model computes under {result.rebuilt_from!r}; exported "
        f"from a copy rebuilt with the same weights (error "
        f"{result.verification.checked_error:.2e} against the copy"
    )
    original = result.original_verification
    if original is not None:
        line += (
            f", {original.checked_error:.2e} against the {result.rebuilt_from} "
            f"model, tolerance {original.tolerance:.2g}"
        )
    return line + ")"


def _row(label, result, checked_on):
    check = result.verification
    source = "random inputs" if check.random_inputs else f"of {checked_on}"
    return (
        label,
        f"{result.size_bytes / 1024:.1f} KiB",
        str(sum(check.ops.values())),
        f"{check.max_abs_error:.2e} ({check.max_rel_error:.1e} max, "
        f"{check.rms_rel_error:.1e} rms rel)",
        f"{check.samples} {source}",
        f"{check.latency_ms:.3f} ms",
        "ok",
    )


def print_table(rows, checked_on):
    """The table of artifacts, one row each, columns padded; under it, a
    hint when a check ran on random inputs (a language model's check on
    text in its own tokenizer did not)."""
    header = ("artifact", "size", "ops", "error", "checked on", "latency/call")
    header += ("status",)
    rows = [header, *rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    column = header.index("checked on")
    random = any(
        "random inputs" in str(row[column]) or "invented" in str(row[column])
        for row in rows[1:]
    )
    if checked_on is None and random:
        print(RANDOM_INPUTS_HINT)
