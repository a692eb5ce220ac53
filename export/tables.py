"""The Markdown tables of the export benchmarks: bench_ondevice.py's, one
function per part, from the rows its parts return (the JSON report holds
the same rows), and bench_architectures.py's."""

from export.ondevice_pairs import EXPORTERS
from export.ondevice_pairs import op_differences
from kerasnorm.export import QUANTIZE_MODES


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _parity(cell, key):
    if "run_error" in cell:
        return "does not run"
    return f"{cell[key]:.1e}" if key == "max_rel" else f"{cell[key]:.3f}"


def _exporter_cells(row, exporter, notes):
    """[builtin, ops, size, ms, error] for float32, then for int8."""
    cells = []
    for mode in ("float32", "int8"):
        cell = row[f"{exporter} {mode}"]
        if "error" in cell:
            notes.append(f"{row['model']}, {exporter} {mode}: {cell['error']}")
            cells.append(["export failed", "-", "-", "-", "-"])
            continue
        if "run_error" in cell:
            notes.append(
                f"{row['model']}, {exporter} {mode} does not run in "
                f"LiteRT: {cell['run_error']}"
            )
        flex = cell["flex"]
        cells.append(
            [
                "yes" if not flex else "no: " + ", ".join(flex),
                str(cell["ops"]),
                f"{cell['size_kib']:.1f}",
                _fmt(cell.get("ms"), ".3f"),
                _parity(cell, "max_rel" if mode == "float32" else "rms_rel"),
            ]
        )
    return cells


def side_by_side_table(rows):
    """Part 1: one line per model and exporter, then the notes (failures,
    the ops in which the two files differ)."""
    lines = [
        "| model | exporter | builtin only | ops | size KiB | float32 ms | "
        "max rel err | int8 builtin only | int8 ms | int8 rms err | "
        "int8 / float32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        for exporter in EXPORTERS:
            cells = _exporter_cells(row, exporter, notes)
            f32, i8 = row[f"{exporter} float32"], row[f"{exporter} int8"]
            ratio = i8["ms"] / f32["ms"] if "ms" in i8 and "ms" in f32 else None
            (builtin, ops, size, ms, err), (i8_builtin, _, _, i8_ms, i8_err) = cells
            label = exporter
            if exporter == "keras" and row.get("keras model") == "Keras layers":
                label = "keras (Keras layers)"
            lines.append(
                f"| {row['model']} | {label} | {builtin} | {ops} | {size} | {ms} | "
                f"{err} | {i8_builtin} | {i8_ms} | {i8_err} | {_fmt(ratio, '.2f')} |"
            )
    lines.append("")
    for row in rows:
        for mode in ("float32", "int8"):
            diff = op_differences(row, mode)
            if diff:
                text = ", ".join(f"{op} {a} vs {b}" for op, (a, b) in diff.items())
                notes.append(
                    f"{row['model']}, {mode} ops differing (kerasnorm vs keras): "
                    + text
                )
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def _verdicts(rows):
    """Per model, the best integer mode's accuracy against float32."""
    notes = []
    for row in rows:
        base = row["float32"].get("accuracy")
        best = [
            (row[m].get("accuracy"), m)
            for m in ("int8", "int16x8")
            if m in row and "error" not in row[m]
        ]
        if base is None or not best:
            continue
        acc, mode = max(best)
        delta = 100 * (acc - base)
        verdict = "met" if delta >= -1 else "NOT met"
        notes.append(
            f"{row['model']}: best integer mode {mode} {delta:+.2f} points against "
            f"float32 (target within 1 point: {verdict})"
        )
    return notes


def modes_table(rows):
    """Part 2: per model Keras' accuracy, then one line per quantize mode."""
    lines = [
        "| model | mode | unrolled | accuracy | rms err | size KiB | ops | "
        "convert s | ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        lines.append(
            f"| {row['model']} | Keras | - | {row['float']['accuracy']:.4f} | - | "
            "- | - | - | - |"
        )
        for mode in QUANTIZE_MODES:
            key = mode or "float32"
            cell = row[key]
            if "error" in cell:
                lines.append(f"| {row['model']} | {key} |" + " - |" * 7)
                notes.append(f"{row['model']}, {key}: {cell['error']}")
                continue
            lines.append(
                f"| {row['model']} | {key} | {cell['unrolled']} | "
                f"{cell['accuracy']:.4f} | {cell['rms_rel']:.4f} | "
                f"{cell['size_kib']:.1f} | {cell['ops']} | {cell['convert_s']} | "
                f"{_fmt(cell.get('ms'), '.3f')} |"
            )
    lines.append("")
    lines += [f"- {note}" for note in notes + _verdicts(rows)]
    return "\n".join(lines)


def int8_table(rows):
    """Part 3: float32, full-integer int8 and fast int8 per model; the
    delegation of each file below."""
    lines = [
        "| model | float32 ms | int8 ms | int8 / float32 | int8 partitions | "
        "int8 rms err | fast int8 ms | fast int8 / float32 | fast partitions | "
        "fast rms err | fast size / float32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        f32, i8, fast = row["float32"], row["int8"], row["fast int8"]
        lines.append(
            f"| {row['model']} | {f32['ms']:.3f} | {i8['ms']:.3f} | "
            f"{i8['ratio']:.2f} | {i8['partitions']} | {i8['rms_rel']:.3f} | "
            f"{fast['ms']:.3f} | {fast['ratio']:.2f} | {fast['partitions']} | "
            f"{fast['rms_rel']:.3f} | {fast['size_ratio']:.2f} |"
        )
        notes.append(
            f"{row['model']}: float32 {f32['delegation']}; int8 "
            f"{i8['delegation']}; fast int8 {fast['delegation']}, in float: "
            + (", ".join(fast["float_ops"]) or "nothing")
        )
    return "\n".join(lines + [""] + [f"- {note}" for note in notes])


def streaming_table(row):
    """Part 4: one line per mode, rms error per length."""
    lengths = [k[4:] for k in row["float32"] if k.startswith("rms@")]
    lines = [
        "| mode | "
        + " | ".join(f"rms err {n} steps" for n in lengths)
        + " | accuracy (28 steps) | partitions | size KiB | step ms |",
        "|---|" + "---|" * (len(lengths) + 4),
        f"| Keras | {' | '.join('-' for _ in lengths)} | "
        f"{row['keras accuracy']:.4f} | - | - | - |",
    ]
    for mode, cell in row.items():
        if not isinstance(cell, dict):
            continue
        errors = " | ".join(f"{cell[f'rms@{n}']:.4f}" for n in lengths)
        lines.append(
            f"| {mode} | {errors} | {cell['accuracy']:.4f} | {cell['partitions']} "
            f"| {cell['size_kib']} | {cell['step_ms']:.4f} |"
        )
    return "\n".join(lines)


# bench_architectures.py: (row key, column title).
ARCHITECTURE_COLUMNS = (
    ("model", "model"),
    ("bn", "BN"),
    ("folded", "folded"),
    ("kept", "kept"),
    ("fold_err", "folded max rel err"),
    ("sm", "SavedModel ms, unfolded / folded"),
    ("float32", "TFLite float32 (size, rel err)"),
    ("int8", "TFLite int8 (size, rel err)"),
)


def architectures_table(rows):
    """bench_architectures.py: one line per model, then the kept-BN reasons."""
    columns = ARCHITECTURE_COLUMNS
    lines = ["| " + " | ".join(title for _, title in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        lines.append(
            "| " + " | ".join(str(row.get(key, "-")) for key, _ in columns) + " |"
        )
    lines.append("")
    for row in rows:
        for reason, count in sorted(row.get("reasons", {}).items()):
            lines.append(f"- {row['model']}: {count} kept: {reason}")
    return "\n".join(lines)
