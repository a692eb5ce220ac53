"""BatchNorm folding and export on real architectures, one table row each.

    python -m export.bench_architectures                  # every model below
    python -m export.bench_architectures --quick          # fewer rounds/samples
    python -m export.bench_architectures --models ResNet50,ConvNeXtTiny

Every model is a `keras.applications` architecture with `weights=None` at
96x96 (logits, no softmax), every BatchNormalization given random moving
mean/variance, gamma and beta (so that a folding mistake shows in the
output) and every `keras.layers.Normalization` given ImageNet statistics with
`finalize_state()` re-run, as loading pretrained weights does. Per model it
prints: BN count, folded, kept (reasons summarized below the table), the max
relative error of the folded Keras model, SavedModel batch-1 latency
unfolded vs folded (medians of interleaved calls, and their ratio), and
TFLite float32 and int8 size and parity (max |tflite - keras| / max |keras|).
A failing step is reported in its cell and the run goes on.
"""

import argparse
import collections
import datetime
import gc
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from benchmarks import machine
from benchmarks.timing import interleaved_medians
from export import files
from export import tables
from export.models import ARCHITECTURES
from export.models import SIZE
from export.models import randomize_statistics
from kerasnorm.export import fold_batchnorm
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite


def _reason_kind(reason):
    """A kept-BN reason without the layer names, to count alike reasons."""
    return re.sub(r"'[^']*'", "X", reason)


def _saved_model_latency(paths, inputs, rounds):
    """Batch-1 medians in ms of each SavedModel, calls interleaved."""
    import tensorflow as tf

    timers = {}
    for path in paths:
        fn = tf.saved_model.load(path).signatures["serving_default"]
        (name,) = fn.structured_input_signature[1]
        feed = {name: tf.constant(inputs[:1])}
        fn(**feed)  # warm up

        def measure(fn=fn, feed=feed):
            start = time.perf_counter()
            fn(**feed)
            return time.perf_counter() - start

        timers[path] = measure
    medians = interleaved_medians(timers, rounds)
    return [1000 * medians[path] for path in paths]


def _fold(model, data):
    """The fold's cells: folded and kept counts, kept reasons, error."""
    folded, report = fold_batchnorm(model, return_report=True)
    want = model.predict(data, verbose=0, batch_size=8)
    got = folded.predict(data, verbose=0, batch_size=8)
    return {
        "folded": len(report.folded),
        "kept": len(report.kept),
        "reasons": collections.Counter(_reason_kind(k.reason) for k in report.kept),
        "fold_err": f"{files.errors(want, got)['max_rel']:.1e}",
    }


def _saved_models(model, data, check, args, workdir):
    paths = []
    for fold in (False, True):
        base = os.path.join(workdir, f"sm_{int(fold)}")
        result = to_saved_model(model, base, fold=fold, version=1, verify_inputs=check)
        paths.append(result.path)
    plain, fast = _saved_model_latency(paths, data, args.rounds)
    return f"{plain:.2f} / {fast:.2f} ({plain / fast:.2f}x)"


def _tflite(model, mode, data, check, args, workdir):
    result = to_tflite(
        model,
        os.path.join(workdir, f"{mode or 'float32'}.tflite"),
        quantize=mode,
        representative_data=data if mode else None,
        calibration_samples=args.samples,
        batch_size=1,
        verify_inputs=check,
        tolerance=float("inf"),  # report parity here, do not gate on it
    )
    size = result.size_bytes / 2**20
    return f"{size:.2f} MiB, {result.verification.max_rel_error:.1e}"


def run_one(name, build, args, workdir):
    """One table row; a failing step is reported in its cell."""
    row = {"model": name}
    keras.utils.set_random_seed(0)
    model = build()
    row["bn"] = randomize_statistics(model)
    rng = np.random.default_rng(1)
    data = rng.uniform(-1.0, 1.0, (args.samples, SIZE, SIZE, 3)).astype("float32")
    check = data[: args.verify]
    try:
        row.update(_fold(model, data))
    except Exception as err:
        row["fold_err"] = f"error: {files.error_text(err, 160)}"
    try:
        row["sm"] = _saved_models(model, data, check, args, workdir)
    except Exception as err:
        row["sm"] = f"error: {files.error_text(err, 160)}"
    for mode in (None, "int8"):
        key = mode or "float32"
        try:
            row[key] = _tflite(model, mode, data, check, args, workdir)
        except Exception as err:
            row[key] = f"error: {files.error_text(err, 160)}"
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", help="comma-separated subset of: " + ", ".join(ARCHITECTURES)
    )
    parser.add_argument(
        "--quick", action="store_true", help="10 latency rounds, 8 samples"
    )
    args = parser.parse_args(argv)
    names = list(ARCHITECTURES)
    if args.models:
        names = [n.strip() for n in args.models.split(",")]
        unknown = [n for n in names if n not in ARCHITECTURES]
        if unknown:
            parser.error(
                f"unknown model(s) {unknown}; choose from {list(ARCHITECTURES)}"
            )
    args.rounds, args.samples, args.verify = (10, 8, 4) if args.quick else (50, 32, 16)
    print(
        f"# {datetime.date.today()}, {SIZE}x{SIZE}, "
        f"{args.rounds} latency rounds, {args.samples} calibration samples, "
        f"{args.verify} parity samples"
    )
    print(machine.header(load_tensorflow=True))
    rows = []
    for name in names:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(run_one(name, ARCHITECTURES[name], args, workdir))
        print(f"{name}: {rows[-1]} ({time.perf_counter() - start:.0f} s)", flush=True)
        keras.backend.clear_session()
        gc.collect()
    print()
    print(tables.architectures_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
