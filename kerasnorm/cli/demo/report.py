"""The demo's results: one table per model, printed and written to
`report.json` and `report.md`."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets

REPORT_FILES = ("report.json", "report.md")


@dataclasses.dataclass
class Row:
    """One artifact's line in a model's table.

    The differences are over the held-out digits, against `reference` (the
    Keras model, or the QAT model for the QAT file); `criterion` and
    `tolerance` are the parity check the exporter passed (`"max"`: max
    |difference| / max |output|, `"rms"`: rms of the difference / rms of the
    output), and `checked_on` what it ran on ("360 test digits").
    """

    artifact: str  # path relative to --out
    format: str
    test_accuracy: float
    size_bytes: int
    latency_ms: float
    reference: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    rms_rel_diff: float | None = None
    criterion: str | None = None
    tolerance: float | None = None
    checked_on: str | None = None
    # XNNPACK partitions and ops outside them (`Verification.delegation`),
    # for a `.tflite` file.
    xnnpack: str | None = None


@dataclasses.dataclass
class ModelReport:
    """One model: how it trained, what folding did, and its artifacts."""

    name: str
    description: str
    params: int
    epochs: int
    epoch_seconds: list[float]
    seconds: dict[str, float]  # wall time of each stage: train, export, qat
    folded: list[str]
    kept: list[str]
    rows: list[Row]
    output_scale: float  # max |logit| of the Keras model on the test digits
    notes: list[str] = dataclasses.field(default_factory=list)


# The `.tflite` files the demo writes of each model, by quantize mode, and
# the format column of their rows (the QAT file adds "TFLite int8, QAT").
TFLITE_MODES = (None, "float16", "int8")
KERAS_FORMAT = "Keras (eager call)"
SAVED_MODEL_FORMAT = "SavedModel"
QAT_FORMAT = "TFLite int8, QAT"


def tflite_format(quantize):
    return f"TFLite {quantize or 'float32'}"


TABLE_HEADER = (
    "artifact",
    "format",
    "test acc.",
    "max abs diff",
    "rms diff",
    "parity check",
    "size",
    "ms/call",
    "XNNPACK",
)


def table_lines(report):
    """The model's table as Markdown lines, padded to line up in a terminal."""
    cells = [TABLE_HEADER]
    for row in report.rows:
        checked = row.reference is not None
        cells.append(
            (
                f"`{row.artifact}`",
                row.format,
                f"{row.test_accuracy:.4f}",
                f"{row.max_abs_diff:.1e}" if checked else "(reference)",
                f"{row.rms_rel_diff:.1e}" if checked else "",
                (
                    f"{row.criterion} ≤ {row.tolerance:g} vs {row.reference} "
                    f"on {row.checked_on}: ok"
                    if checked
                    else ""
                ),
                f"{row.size_bytes / 1024:.1f} KiB",
                f"{row.latency_ms:.3f}",
                row.xnnpack or "",
            )
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_HEADER))]

    def line(values):
        return (
            "| "
            + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True))
            + " |"
        )

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return [line(cells[0]), rule, *(line(c) for c in cells[1:])]


def summary_lines(report):
    """The lines above a model's table: training and folding."""
    seconds = report.epoch_seconds
    later = seconds[1:]
    training = f"{report.epochs} epochs with XLA: first {seconds[0]:.1f} s"
    if later:
        training += f" (with the compile), then {sum(later) / len(later):.2f} s each"
    folding = f"BatchNorm folding: {len(report.folded)} folded" + "".join(
        f" ({f})" for f in report.folded
    )
    folding += f", {len(report.kept)} kept" + "".join(f" ({k})" for k in report.kept)
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items())
    return [
        f"{report.description}; {report.params:,} params.",
        training + ".",
        folding + ".",
        f"Wall time: {stages}.",
        f"Differences are in logits; the largest |logit| on the test digits "
        f"is {report.output_scale:.1f}.",
    ]


def print_table(report):
    print(f"\n{report.name}")
    for line in [*summary_lines(report), "", *table_lines(report), *report.notes]:
        print(line)


def markdown_report(reports, meta):
    lines = [
        "# kerasnorm demo",
        "",
        f"{meta['data']}; seed {meta['seed']}"
        + ("; `--quick`" if meta["quick"] else "")
        + f"; {meta['seconds']:.0f} s in all. TensorFlow {meta['tensorflow']}, "
        f"Keras {meta['keras']}.",
        "",
        "Differences are over the test digits against the model each file was "
        "exported from; ms/call is the median latency at batch 1 (Keras: an "
        "eager call).",
        "",
        "The parity check is the exporter's, and its tolerances are relative "
        "to the output scale, not absolute: `max ≤ t` bounds the largest "
        "|difference| over all test digits divided by the largest |logit| of "
        "the reference on them (for the Keras model, the one given above each "
        "table), "
        "so a max abs diff above `t` passes when it is within `t` of that "
        "scale; `rms ≤ t` (int8) bounds the root mean square of the "
        "difference divided by that of the reference's logits. The rms diff "
        "column is that relative rms.",
        "",
        "XNNPACK is how each `.tflite` file runs on LiteRT's default CPU "
        "delegate: its partitions and the ops left on the reference kernels "
        "(one partition, nothing outside, is the fast case). The int8 files "
        "keep the norms' statistics in float inside the partition; "
        "`--int8-io` gives the integer-only file.",
    ]
    for report in reports:
        lines += ["", f"## {report.name}", "", *summary_lines(report), ""]
        lines += table_lines(report)
        lines += [f"\n{note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def write_reports(out, reports, args, budget, seconds):
    """`report.json` and `report.md`, each written whole or not at all."""
    import keras
    import tensorflow as tf

    meta = {
        "data": "scikit-learn digits, 80/20 split",
        "seed": args.seed,
        "quick": bool(args.quick),
        "budget": dataclasses.asdict(budget),
        "seconds": seconds,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    document = {**meta, "models": [dataclasses.asdict(r) for r in reports]}
    _write_text(os.path.join(out, "report.json"), json.dumps(document, indent=2))
    _write_text(os.path.join(out, "report.md"), markdown_report(reports, meta))


def _write_text(path, text):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    write_atomically(path, write)


def write_atomically(path, write):
    """`write(tmp)` to a new temporary file beside `path`, then moved there:
    a failure leaves `path` as it was and no temporary behind. The temporary
    keeps `path`'s extension (`model.save` insists on `.keras`) and is
    created with the modes `open` gives (0o666 less the umask), not
    `tempfile`'s owner-only 0o600: it becomes the user's file."""
    parent, name = os.path.split(os.path.abspath(path))
    suffix = os.path.splitext(name)[1]
    while True:
        tmp = os.path.join(parent, f".{name}.tmp-{secrets.token_hex(4)}{suffix}")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
