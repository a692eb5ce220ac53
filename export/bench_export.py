"""Benchmark exported artifacts of a small ResNet-style CNN trained on digits.

    python -m export.bench_export [--epochs 15] [--rounds 300] [--seed 0]

Trains a CNN with BatchNorm (a stem and three residual blocks) on
scikit-learn's 8x8 digits, then exports it with `kerasnorm.export`:

- SavedModel with BatchNorm folded and unfolded, and the Keras model itself;
- TFLite float32, float16, dynamic-range and full-integer int8.

Latency is per call at batch 1 on CPU. All candidates are timed in the same
loop, one call each per round in a rotating order, so that load from other
processes hits them alike; the figures are medians over the rounds, and the
ratios (folded vs unfolded) are what to compare across machines. Accuracy is
on the held-out 20% of digits.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from benchmarks import machine
from benchmarks.timing import interleaved_medians
from export import data
from export import files
from export.models import digits_resnet
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite

L = keras.layers


def per_call(fn, warmup=5):
    """A timer of one call of `fn` (seconds), after `warmup` calls."""
    for _ in range(warmup):
        fn()

    def measure():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


def tflite_accuracy(path, x, y):
    logits = files.first_output(files.runner(files.read(path)), x)
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(machine.header(load_tensorflow=True))

    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = data.digits(args.seed)
    model = digits_resnet()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, verbose=0)
    _, keras_acc = model.evaluate(x_test, y_test, verbose=0)
    print(
        f"trained {model.name} ({model.count_params()} params, "
        f"{sum(isinstance(x, L.BatchNormalization) for x in model.layers)} BN) "
        f"for {args.epochs} epochs in {time.perf_counter() - start:.0f} s; "
        f"Keras test accuracy {keras_acc:.4f}"
    )

    out = tempfile.mkdtemp(prefix="bench_export-")
    calibration = x_train[:200]
    check = x_test[:64]
    folded = to_saved_model(model, os.path.join(out, "folded"), verify_inputs=check)
    unfolded = to_saved_model(
        model, os.path.join(out, "unfolded"), fold=False, verify_inputs=check
    )
    print(folded.fold_report)
    tflite = {}
    for mode in (None, "float16", "dynamic", "int8"):
        tflite[mode or "float32"] = to_tflite(
            model,
            os.path.join(out, f"model.{mode or 'float32'}.tflite"),
            quantize=mode,
            representative_data=calibration,
            batch_size=1,
            verify_inputs=check,
        )

    one = x_test[:1]
    one_tf = tf.constant(one)
    candidates = {"keras (eager call)": lambda: model(one_tf, training=False)}
    saved = {"SavedModel unfolded": unfolded, "SavedModel folded": folded}
    for label, result in saved.items():
        fn = tf.saved_model.load(result.path).signatures["serving_default"]
        candidates[label] = lambda fn=fn: fn(image=one_tf)
    for mode, result in tflite.items():
        runner = files.runner(files.read(result.path))
        candidates[f"TFLite {mode}"] = lambda runner=runner: runner([one])
    timers = {name: per_call(fn) for name, fn in candidates.items()}
    medians = interleaved_medians(timers, args.rounds)

    accuracy = {"keras (eager call)": keras_acc}
    for label, result in saved.items():
        fn = tf.saved_model.load(result.path).signatures["serving_default"]
        logits = fn(image=tf.constant(x_test))["logits"].numpy()
        accuracy[label] = float(np.mean(np.argmax(logits, -1) == y_test))
    for mode, result in tflite.items():
        accuracy[f"TFLite {mode}"] = tflite_accuracy(result.path, x_test, y_test)
    results = dict(saved)
    results.update({f"TFLite {m}": r for m, r in tflite.items()})

    print(
        f"\nbatch 1, median of {args.rounds} interleaved rounds, "
        f"{len(y_test)} test digits"
    )
    header = (
        f"{'artifact':22} {'size':>10} {'ops':>5} {'max rel err':>12} "
        f"{'ms/call':>9} {'accuracy':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, seconds in medians.items():
        result = results.get(name)
        size = f"{result.size_bytes / 1024:.1f} KiB" if result else "-"
        ops = str(sum(result.verification.ops.values())) if result else "-"
        err = f"{result.verification.max_rel_error:.1e}" if result else "-"
        print(
            f"{name:22} {size:>10} {ops:>5} {err:>12} {1e3 * seconds:>9.3f} "
            f"{accuracy[name]:>9.4f}"
        )
    speedup = medians["SavedModel unfolded"] / medians["SavedModel folded"]
    delta = 100 * (accuracy["TFLite int8"] - accuracy["TFLite float32"])
    print(
        f"\nSavedModel folded vs unfolded: {speedup:.2f}x faster "
        f"(target >= 1.2x: {'met' if speedup >= 1.2 else 'NOT met'})"
    )
    print(
        f"TFLite int8 vs float32 accuracy: {delta:+.2f} points "
        f"(target within 1 point: {'met' if abs(delta) <= 1 else 'NOT met'})"
    )
    ratio = tflite["int8"].size_bytes / tflite["float32"].size_bytes
    print(f"TFLite int8 size: {ratio:.2f} of float32")
    print(f"artifacts in {out}")


if __name__ == "__main__":
    main()
