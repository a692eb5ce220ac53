"""The demo's stages for each model: train with XLA, export, verify, measure.

`run_demo` runs the conv net's and the LN-LSTM's
stages and writes the reports (`kerasnorm.cli.demo.report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

from kerasnorm.cli.demo.data import load_digits
from kerasnorm.cli.demo.models import build_lstm_model
from kerasnorm.cli.demo.models import build_model
from kerasnorm.cli.demo.models import seeded
from kerasnorm.cli.demo.report import KERAS_FORMAT
from kerasnorm.cli.demo.report import QAT_FORMAT
from kerasnorm.cli.demo.report import REPORT_FILES
from kerasnorm.cli.demo.report import SAVED_MODEL_FORMAT
from kerasnorm.cli.demo.report import TFLITE_MODES
from kerasnorm.cli.demo.report import ModelReport
from kerasnorm.cli.demo.report import Row
from kerasnorm.cli.demo.report import print_table
from kerasnorm.cli.demo.report import tflite_format
from kerasnorm.cli.demo.report import write_atomically
from kerasnorm.cli.demo.report import write_reports

BATCH_SIZE = 64
LEARNING_RATE = 3e-3
# The QAT model is already trained: fine-tune at a thirtieth of the rate.
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


def run_demo(args) -> int:
    """Train, export, verify and report; the exit status.

    `args` have passed `kerasnorm_cli.checks` (an empty or new --out, or
    --force).
    """
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
        return "parity"
    except export.ExportConversionError as err:
        print(f"kerasnorm demo: error: {err}", file=sys.stderr)
        return "conversion"
    write_reports(args.out, reports, args, budget, time.perf_counter() - start)
    print(
        f"\nDone in {time.perf_counter() - start:.0f} s. Reports: "
        + ", ".join(os.path.join(args.out, name) for name in REPORT_FILES)
    )
    return "ok"


def conv_net_showcase(args, budget):
    """Train, export and verify the conv net, QAT int8 included."""
    data = load_digits(args.seed)
    model = seeded(args.seed, build_model)
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
        seeded(args.seed, build_lstm_model, budget.lstm_units),
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
            format=KERAS_FORMAT,
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
    rows.append(_row(saved, SAVED_MODEL_FORMAT, args.out, (x_test, y_test)))
    for quantize in TFLITE_MODES:
        suffix = "" if quantize is None else f".{quantize}"
        # A phone runs one image per call: a fixed batch of 1 keeps the
        # file one XNNPACK partition (a dynamic batch, the default, puts the
        # shape arithmetic outside it).
        result = export.to_tflite(
            model,
            os.path.join(args.out, f"{name}{suffix}.tflite"),
            quantize=quantize,
            batch_size=1,
            representative_data=(
                x_train[: budget.calibration_samples] if quantize == "int8" else None
            ),
            overwrite=args.force,
            verify_inputs=x_test,
            verbose=args.verbose,
        )
        rows.append(_row(result, tflite_format(quantize), args.out, (x_test, y_test)))
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
    row = _row(result, QAT_FORMAT, args.out, (x_test, y_test), "QAT model")
    return row, None


def _save_keras(model, path):
    write_atomically(path, model.save)


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
        checked_on=(
            f"{check.samples} random inputs"
            if check.random_inputs
            else f"{check.samples} test digits"
        ),
        xnnpack=None if check.delegation is None else _xnnpack(check.delegation),
    )


def _xnnpack(split):
    """A report cell: "1 partition, 0 ops outside" or with the ops named."""
    cell = f"{split.partitions} partition{'s' * (split.partitions != 1)}, "
    if not split.undelegated:
        return cell + "0 ops outside"
    return (
        cell
        + ", ".join(f"{name} {n}" for name, n in split.undelegated.items())
        + " outside"
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
