"""What the export commands share (`kerasnorm export`, `kerasnorm qat`): exit
statuses, the artifact jobs and how they run, the table they print, and the
inputs files they read."""

from __future__ import annotations

import dataclasses
import sys

EXIT_OK = 0
EXIT_PARITY = 1
EXIT_USAGE = 2
EXIT_CONVERSION = 3


@dataclasses.dataclass
class Job:
    """One artifact a command writes: its label in the table, the path that
    must not exist without --force, and the function that writes it."""

    label: str  # the artifact's path relative to --out
    target: str  # what must not exist without --force
    export: object  # (model, calibration, check_inputs) -> ExportResult


def load_inputs(path, model, option):
    """The model inputs in a `.npy` / `.npz` file (arrays by input name, or in
    order), checked against `model`; None without a path."""
    if path is None:
        return None
    import keras
    import numpy as np

    from kerasnorm.export import model_inputs

    if path.endswith(".npy"):
        data = np.load(path, allow_pickle=False)
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as archive:
            names = [x.name for x in model.inputs]
            if set(names) <= set(archive.files):
                data = {n: archive[n] for n in names}
            else:
                data = [archive[k] for k in archive.files]
    else:
        raise ValueError(f"{option} should be a .npy or .npz file. Received: {path!r}")
    return keras.tree.flatten(model_inputs(model, data, argument=f"{option} {path}"))


def export_all(jobs, model, calibration, check_inputs):
    """Run every job; (exit status, table rows). A failure stops no other job;
    the status is the first failure's."""
    from kerasnorm import export

    # Most specific first: ExportConversionError is a ValueError.
    failures = [
        (export.ExportVerificationError, "FAILED parity", EXIT_PARITY),
        (export.FoldVerificationError, "FAILED folding", EXIT_PARITY),
        (export.ExportConversionError, "conversion failed", EXIT_CONVERSION),
        (ValueError, "error", EXIT_USAGE),
        (OSError, "error", EXIT_USAGE),
    ]
    rows = []
    status = EXIT_OK
    report_shown = False
    for job in jobs:
        try:
            result = job.export(model, calibration, check_inputs)
        except tuple(kind for kind, _, _ in failures) as err:
            print(f"kerasnorm export: {job.label}: {err}", file=sys.stderr)
            _, text, code = next(f for f in failures if isinstance(err, f[0]))
            rows.append((job.label, "-", "-", "-", "-", text))
            status = status or code
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
        rows.append(_row(job.label, result))
    return status, rows


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


def _row(label, result):
    check = result.verification
    return (
        label,
        f"{result.size_bytes / 1024:.1f} KiB",
        str(sum(check.ops.values())),
        f"{check.max_abs_error:.2e} ({check.max_rel_error:.1e} max, "
        f"{check.rms_rel_error:.1e} rms rel)",
        f"{check.latency_ms:.3f} ms",
        "ok",
    )


def print_table(rows):
    """The table of artifacts, one row each, columns padded."""
    header = ("artifact", "size", "ops", "error", "latency/call", "status")
    rows = [header, *rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
