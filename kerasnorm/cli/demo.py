"""`kerasnorm demo`: the library end to end on scikit-learn's digits.

Trains two models with XLA (`kerasnorm.training.compile(jit_compile=True)`)
on scikit-learn's bundled 8x8 digits (no download): a conv net with a
Conv+BatchNorm stem, GroupNorm, InstanceNorm, LayerNorm and pRMSNorm, and an
LN-LSTM that reads each digit as a sequence of its 8 rows. Each model is
saved as a `.keras` file and exported with `kerasnorm.export` (BatchNorm
folded) to a SavedModel and float32, float16 and int8 `.tflite` files, and
the conv net also to a quantization-aware-trained int8 `.tflite` when the
`qat` extra is installed. Every artifact is checked against the model it
came from on the held-out digits; one table per model (test accuracy, max
output difference, size, latency per call) is printed and written to
`report.json` and `report.md` in --out, which must be empty (or --force).
Exit status: 0 done, 1 an artifact failed its parity check, 2 bad arguments
or a non-empty --out without --force (nothing written), 3 the converter
failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sys
import time

from kerasnorm.cli import export as export_cli

DEFAULT_OUT = "kerasnorm-demo"
REPORT_FILES = ("report.json", "report.md")
BATCH_SIZE = 64
LEARNING_RATE = 3e-3
# The QAT model is already trained: fine-tune at a tenth of the rate.
QAT_LEARNING_RATE = 1e-4


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much work each stage does: the full demo or `--quick`."""

    conv_epochs: int
    lstm_epochs: int
    lstm_units: int
    qat_epochs: int
    calibration_samples: int


FULL = Budget(
    conv_epochs=10, lstm_epochs=10, lstm_units=64, qat_epochs=2, calibration_samples=200
)
QUICK = Budget(
    conv_epochs=3, lstm_epochs=3, lstm_units=32, qat_epochs=1, calibration_samples=100
)


@dataclasses.dataclass
class Row:
    """One artifact's line in a model's table.

    The differences are over the held-out digits, against `reference` (the
    Keras model, or the QAT model for the QAT file); `criterion` and
    `tolerance` are the parity check the exporter passed (`"max"`: max
    |difference| / max |output|, `"rms"`: rms of the difference / rms of the
    output).
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


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "demo",
        help="train a conv net with every kerasnorm norm layer and an LN-LSTM "
        "under XLA, export and verify them, and report",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"output directory; must be empty or absent (default: {DEFAULT_OUT})",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out, replacing the demo's own files",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer epochs, a smaller LSTM and less calibration (a smoke run)",
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs for both models (default: 10, quick: 3)"
    )
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's and the TFLite converter's own logs",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    """Train, export, verify and report; the exit status."""
    problem = _check_arguments(args)
    if problem:
        print(f"kerasnorm demo: error: {problem}", file=sys.stderr)
        return export_cli.EXIT_USAGE
    budget = QUICK if args.quick else FULL
    if args.epochs is not None:
        budget = dataclasses.replace(
            budget, conv_epochs=args.epochs, lstm_epochs=args.epochs
        )
    from kerasnorm import export

    os.makedirs(args.out, exist_ok=True)
    # A report describes the artifacts of one run: a stale one from an
    # earlier run must not outlive a run that fails half-way.
    for name in REPORT_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(args.out, name))
    start = time.perf_counter()
    try:
        reports = [
            conv_net_showcase(args, budget),
            lstm_showcase(args, budget),
        ]
    except export.ExportVerificationError as err:
        print(f"kerasnorm demo: error: {err}", file=sys.stderr)
        return export_cli.EXIT_PARITY
    except export.ExportConversionError as err:
        print(f"kerasnorm demo: error: {err}", file=sys.stderr)
        return export_cli.EXIT_CONVERSION
    write_reports(args.out, reports, args, budget, time.perf_counter() - start)
    print(
        f"\nDone in {time.perf_counter() - start:.0f} s. Reports: "
        + ", ".join(os.path.join(args.out, name) for name in REPORT_FILES)
    )
    return export_cli.EXIT_OK


def _check_arguments(args):
    """What is wrong with the arguments, before any work; `None` if nothing."""
    if args.epochs is not None and args.epochs < 1:
        return f"--epochs must be at least 1. Received: --epochs {args.epochs}"
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        return f"--out {args.out!r} exists and is not a directory."
    entries = os.listdir(args.out) if os.path.isdir(args.out) else []
    if entries and not args.force:
        return (
            f"--out {args.out!r} is not empty ({len(entries)} entries). The "
            "demo writes into an empty or new directory; pass --force to write "
            "into this one anyway (replacing the demo's own files there), or "
            "choose another --out. Nothing was written."
        )
    return None


def load_digits(seed=0):
    """scikit-learn's digits as (x_train, y_train, x_test, y_test), x in [0, 1].

    `x` has shape `(n, 8, 8, 1)`; an 80/20 split after a seeded shuffle.
    """
    import numpy as np

    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as err:
        raise SystemExit(
            "The demo trains on scikit-learn's digits: "
            'pip install "kerasnorm[examples]"'
        ) from err
    data = sk_load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def build_model():
    """The conv net: a Conv+BatchNorm stem, then every kerasnorm norm layer."""
    import keras

    from kerasnorm import norms

    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            norms.GroupNorm(groups=8),
            keras.layers.ReLU(),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            norms.InstanceNorm(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64),
            norms.LayerNorm(),
            keras.layers.ReLU(),
            keras.layers.Dense(64),
            norms.RMSNorm(partial=0.25),
            keras.layers.ReLU(),
            keras.layers.Dense(10, name="logits"),
        ],
        name="conv_net",
    )


def build_lstm_model(units=64):
    """An LN-LSTM reading a digit as a sequence of its 8 rows of 8 pixels."""
    import keras

    from kerasnorm import recurrent

    return keras.Sequential(
        [
            keras.Input((8, 8), name="rows"),
            # Unrolled: TensorFlow 2.21's int8 converter crashes the process
            # on the while loop of a rolled RNN (Keras' own LSTM too), and 8
            # fixed steps unroll cheaply.
            recurrent.LayerNormLSTM(units, unroll=True),
            keras.layers.Dense(10, name="logits"),
        ],
        name="ln_lstm",
    )


def conv_net_showcase(args, budget):
    """Train, export and verify the conv net, QAT int8 included."""
    data = load_digits(args.seed)
    model = _seeded(args.seed, build_model)
    report = _train_and_export(
        model,
        "Conv+BatchNorm+ReLU stem, GroupNorm(8), InstanceNorm, LayerNorm, "
        "pRMSNorm (partial=0.25)",
        data,
        budget.conv_epochs,
        args,
        budget,
    )
    start = time.perf_counter()
    row, note = qat_int8_row(model, data, args, budget)
    report.seconds["qat"] = time.perf_counter() - start
    if row is not None:
        report.rows.append(row)
    if note:
        report.notes.append(note)
    print_table(report)
    return report


def lstm_showcase(args, budget):
    """Train, export and verify the LN-LSTM sequence classifier."""
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    data = (x_train[..., 0], y_train, x_test[..., 0], y_test)
    report = _train_and_export(
        _seeded(args.seed, build_lstm_model, budget.lstm_units),
        f"LayerNormLSTM({budget.lstm_units}) over the 8 rows of a digit, "
        "then Dense(10)",
        data,
        budget.lstm_epochs,
        args,
        budget,
    )
    print_table(report)
    return report


def _train_and_export(model, description, data, epochs, args, budget):
    x_train, y_train, _, _ = data
    print(
        f"\n== {model.name}: {description}; {model.count_params():,} params, "
        f"{len(x_train)} training and {len(data[2])} test digits"
    )
    start = time.perf_counter()
    epoch_seconds = train(model, x_train, y_train, epochs, args.seed)
    seconds = {"train": time.perf_counter() - start}
    rows, fold_report = export_artifacts(model, data, args, budget)
    logits = model.predict(data[2], verbose=0)
    seconds["export"] = time.perf_counter() - seconds["train"] - start
    return ModelReport(
        name=model.name,
        description=description,
        params=int(model.count_params()),
        epochs=epochs,
        epoch_seconds=epoch_seconds,
        seconds=seconds,
        folded=[f"{f.batchnorm} -> {f.into}" for f in fold_report.folded],
        kept=[f"{k.batchnorm}: {k.reason}" for k in fold_report.kept],
        rows=rows,
        output_scale=float(abs(logits).max()),
    )


def _seeded(seed, build, *args):
    """`build(*args)` with every random generator seeded: the same initial
    weights, and with `train` the same model, on every run."""
    import keras

    keras.utils.set_random_seed(seed)
    return build(*args)


def train(model, x, y, epochs, seed):
    """Fit `model` with XLA; the seconds each epoch took."""
    import keras
    import tensorflow as tf

    from kerasnorm import training

    training.compile(
        model,
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    # Full batches only: a last, smaller batch would be one more XLA program
    # to compile, and another when Keras retraces for both batch sizes.
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed)
        .batch(BATCH_SIZE, drop_remainder=True)
    )
    print(
        f"Training {epochs} epochs with XLA (kerasnorm.training.compile, "
        "jit_compile=True); the first epoch includes the XLA compile."
    )
    seconds = []
    clock = {}
    timer = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: clock.update(start=time.perf_counter()),
        on_epoch_end=lambda epoch, logs: seconds.append(
            time.perf_counter() - clock["start"]
        ),
    )
    # The dataset shuffles itself each epoch; `shuffle=False` only tells Keras
    # not to warn that it cannot.
    model.fit(dataset, epochs=epochs, verbose=1, callbacks=[timer], shuffle=False)
    later = seconds[1:]
    print(
        f"First epoch {seconds[0]:.1f} s (with the XLA compile)"
        + (f", then {sum(later) / len(later):.2f} s per epoch." if later else ".")
    )
    return seconds


def export_artifacts(model, data, args, budget):
    """The `.keras` file and every export of `model`, each verified; the
    table rows and the fold report."""
    from kerasnorm import export

    x_train, _, x_test, y_test = data
    name = model.name
    keras_file = f"{name}.keras"
    _save_keras(model, os.path.join(args.out, keras_file))
    rows = [
        Row(
            artifact=keras_file,
            format="Keras (eager call)",
            test_accuracy=_accuracy(model.predict(x_test, verbose=0), y_test),
            size_bytes=os.path.getsize(os.path.join(args.out, keras_file)),
            latency_ms=_keras_latency_ms(model, x_test),
        )
    ]
    print(f"Exporting {name}: SavedModel, TFLite float32, float16, int8 ...")
    saved = export.to_saved_model(
        model,
        os.path.join(args.out, name),
        version=1,
        overwrite=args.force,
        verify_inputs=x_test,
    )
    rows.append(_row(saved, "SavedModel", args.out, (x_test, y_test)))
    for quantize in (None, "float16", "int8"):
        suffix = "" if quantize is None else f".{quantize}"
        result = export.to_tflite(
            model,
            os.path.join(args.out, f"{name}{suffix}.tflite"),
            quantize=quantize,
            representative_data=(
                x_train[: budget.calibration_samples] if quantize == "int8" else None
            ),
            overwrite=args.force,
            verify_inputs=x_test,
            verbose=args.verbose,
        )
        label = f"TFLite {quantize or 'float32'}"
        rows.append(_row(result, label, args.out, (x_test, y_test)))
    return rows, saved.fold_report


def qat_int8_row(model, data, args, budget):
    """The conv net's quantization-aware int8 artifact: `(row, note)`.

    `quantize_aware` rebuilds the trained model as `tf_keras` with TFMOT's
    quantization simulation; it is fine-tuned briefly and exported with
    `to_tflite(quantize="int8")`, verified against that QAT model. Without
    the `qat` extra (tf-keras, tensorflow-model-optimization) the row is
    `None` and the note says so.
    """
    from kerasnorm import export

    x_train, y_train, x_test, y_test = data
    try:
        qat_model = export.quantize_aware(model, verify_inputs=x_test[:64])
    except ImportError as err:
        note = f"QAT int8 skipped: {err}"
        print(note)
        return None, note
    import tf_keras

    print(
        f"Quantization-aware fine-tuning of {model.name} ({budget.qat_epochs} "
        f"epoch(s) at {QAT_LEARNING_RATE:g}, tf_keras with TFMOT's quantization "
        "simulation) ..."
    )
    tf_keras.utils.set_random_seed(args.seed)
    qat_model.compile(
        tf_keras.optimizers.Adam(QAT_LEARNING_RATE),
        tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    qat_model.fit(
        x_train, y_train, batch_size=BATCH_SIZE, epochs=budget.qat_epochs, verbose=1
    )
    result = export.to_tflite(
        qat_model,
        os.path.join(args.out, f"{model.name}.qat.int8.tflite"),
        quantize="int8",
        representative_data=x_train[: budget.calibration_samples],
        overwrite=args.force,
        verify_inputs=x_test,
        verbose=args.verbose,
    )
    row = _row(result, "TFLite int8, QAT", args.out, (x_test, y_test), "QAT model")
    return row, None


def _save_keras(model, path):
    _atomically(path, model.save)


def _row(result, label, out, test, reference="Keras"):
    x_test, y_test = test
    check = result.verification
    return Row(
        artifact=os.path.relpath(result.path, out),
        format=label,
        test_accuracy=_accuracy(artifact_logits(result.path, x_test), y_test),
        size_bytes=result.size_bytes,
        latency_ms=check.latency_ms,
        reference=reference,
        max_abs_diff=check.max_abs_error,
        max_rel_diff=check.max_rel_error,
        rms_rel_diff=check.rms_rel_error,
        criterion=check.criterion,
        tolerance=check.tolerance,
    )


def artifact_logits(path, x):
    """The outputs of a `.tflite` file or a SavedModel (one input, one output)."""
    from kerasnorm.export import litert

    if path.endswith(".tflite"):
        with open(path, "rb") as f:
            return litert.Runner(f.read()).predict(x)[0]
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    (input_name,) = serve.structured_input_signature[1]
    (logits,) = serve(**{input_name: tf.constant(x)}).values()
    return logits.numpy()


def _accuracy(logits, y):
    import numpy as np

    return float(np.mean(np.argmax(logits, -1) == y))


def _keras_latency_ms(model, x, runs=30):
    """Median ms of an eager `model(one_sample)` call, after a warm-up call."""
    import numpy as np

    one = x[:1]
    model(one)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model(one)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


TABLE_HEADER = (
    "artifact",
    "format",
    "test acc.",
    "max abs diff",
    "rms diff",
    "parity check",
    "size",
    "ms/call",
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
                    f"{row.criterion} ≤ {row.tolerance:g} vs {row.reference}: ok"
                    if checked
                    else ""
                ),
                f"{row.size_bytes / 1024:.1f} KiB",
                f"{row.latency_ms:.3f}",
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
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    _atomically(path, write)


def _atomically(path, write):
    """`write(tmp)` to a temporary file beside `path`, then rename it there.

    The temporary keeps `path`'s extension (`model.save` insists on
    `.keras`); a failure leaves `path` as it was and no temporary behind.
    """
    root, ext = os.path.splitext(os.path.basename(path))
    tmp = os.path.join(
        os.path.dirname(path), f".{root}.tmp-{secrets.token_hex(4)}{ext}"
    )
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
