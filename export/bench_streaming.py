"""Streaming step files against whole-sequence files, side by side.

    python -m export.bench_streaming [--steps 8 32] [--units 32] [--no-digits]

For a LayerNormLSTM and a LayerNormGRU trained on a task whose answer needs
the state (the running sum of two of four input features), per sequence
length: the parity error of each quantize mode of the streaming step (run
over the held-out sequences from zero states, rms error over the output's
rms), that of the whole-sequence int8 file (the layer rebuilt with
`unroll=True`, the only way a rolled loop converts at int8), the file
sizes, and LiteRT latency: one step call against one whole-sequence call
(batch 1, medians of interleaved runs), so the ratio says what streaming
costs per frame. Then a classifier: a LayerNormLSTM(64) over the 8 rows of
scikit-learn's digits (the last output feeds the logits), its test accuracy
in float32, as an int8 streaming step, and as a whole-sequence int8 file.
"""

import argparse
import os
import tempfile
import time

import keras
import numpy as np

import kerasnorm
from benchmarks import machine
from benchmarks.timing import interleaved_medians
from export import data
from export import files
from export.models import sequence_regressor
from kerasnorm.export import to_tflite

MODES = (None, "float16", "dynamic", "int8")
# Latency: calls of each file, interleaved; the median per call.
ROUNDS = 200


def per_call(fn):
    """A timer of one call of `fn`, in seconds."""

    def measure():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


def _line(name, kind, mode, result):
    check = result.verification
    print(
        f"{name:28} {kind:9} {mode or 'float32':8} rms {check.rms_rel_error:.4f}"
        f"  max {check.max_rel_error:.4f}  {result.size_bytes / 1024:6.1f} KiB"
    )


def bench(cls, units, steps, out):
    keras.utils.set_random_seed(0)
    x, y = data.cumulative_sum(1024, steps, seed=0)
    x_test, _ = data.cumulative_sum(128, steps, seed=1)
    model = sequence_regressor(cls, units, steps)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x, y, epochs=10, batch_size=32, verbose=0)
    name = f"{cls.__name__}, {steps} steps"
    common = {
        "representative_data": x[:256],
        "verify_inputs": x_test,
        "batch_size": 1,
        "overwrite": True,
        "tolerance": 1.0,
    }
    for mode in MODES:
        path = os.path.join(out, f"step.{mode}.tflite")
        result = to_tflite(model, path, streaming=True, quantize=mode, **common)
        _line(name, "streaming", mode, result)
    unrolled = sequence_regressor(cls, units, steps, unroll=True)
    unrolled.set_weights(model.get_weights())
    for mode in (None, "int8"):
        whole = os.path.join(out, f"whole.{mode}.tflite")
        result = to_tflite(unrolled, whole, quantize=mode, **common)
        _line(name, "whole", mode, result)
        stream = files.streaming_runner(
            files.read(os.path.join(out, f"step.{mode}.tflite"))
        )
        runner = files.runner(files.read(whole))
        ms = interleaved_medians(
            {
                "step": per_call(lambda s=stream: s.step(x_test[:1, 0])),
                "whole": per_call(lambda r=runner: r(x_test[:1])),
            },
            ROUNDS,
        )
        step_ms, whole_ms = 1e3 * ms["step"], 1e3 * ms["whole"]
        print(
            f"{name:28} latency   {mode or 'float32':8} step {step_ms:.4f} ms, "
            f"whole sequence {whole_ms:.4f} ms ({whole_ms / step_ms:.1f} steps)"
        )


def _classifier(unroll=False):
    return keras.Sequential(
        [
            keras.Input((8, 8)),
            kerasnorm.LayerNormLSTM(64, unroll=unroll),
            keras.layers.Dense(10),
        ]
    )


def _accuracy(logits, y):
    return np.mean(np.argmax(logits, -1) == y)


def digits(out):
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = data.digits_rows(seed=0)
    model = _classifier()
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, epochs=15, batch_size=32, verbose=0)
    accuracy = _accuracy(model.predict(x_test, verbose=0), y_test)
    print(f"digits LayerNormLSTM(64)     keras    float32  accuracy {accuracy:.4f}")
    int8 = {
        "quantize": "int8",
        "representative_data": x_train[:200],
        "verify_inputs": x_test,
        "batch_size": 1,
        "overwrite": True,
    }
    path = os.path.join(out, "digits.int8.tflite")
    result = to_tflite(model, path, streaming=True, **int8)
    stream = files.streaming_runner(files.read(path))
    logits = []
    for sequence in x_test:
        stream.reset()
        logits.append(stream.run(sequence[None])[0][:, -1])
    accuracy = _accuracy(np.concatenate(logits), y_test)
    print(
        f"digits LayerNormLSTM(64)     streaming int8     accuracy {accuracy:.4f}"
        f"  rms {result.verification.rms_rel_error:.4f}"
    )
    unrolled = _classifier(unroll=True)
    unrolled.set_weights(model.get_weights())
    path = os.path.join(out, "digits.whole.int8.tflite")
    result = to_tflite(unrolled, path, **int8)
    logits = files.first_output(files.runner(files.read(path)), x_test)
    print(
        f"digits LayerNormLSTM(64)     whole    int8     accuracy "
        f"{_accuracy(logits, y_test):.4f}"
        f"  rms {result.verification.rms_rel_error:.4f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--no-digits", action="store_true")
    args = parser.parse_args()
    print(machine.header(load_tensorflow=True))
    with tempfile.TemporaryDirectory() as out:
        if not args.no_digits:
            digits(out)
        for steps in args.steps:
            for cls in (kerasnorm.LayerNormLSTM, kerasnorm.LayerNormGRU):
                bench(cls, args.units, steps, out)


if __name__ == "__main__":
    main()
