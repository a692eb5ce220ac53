"""The three matrix products of a Dense layer's training step, XLA vs not.

A Dense layer's training step computes `x @ W` (forward), `dy @ W^T` (the
input's gradient) and `x^T @ dy` (the kernel's gradient). This times each
one alone, as `tf.matmul` with the transpose flags TensorFlow's gradient
uses, inside a `tf.function` with `jit_compile=True` (XLA:CPU) and without
(TensorFlow's oneDNN kernels), at shapes of the training benchmark's models
(rows = batch x tokens). Interleaved rounds, medians (benchmarks/timing.py).

Usage: python -m benchmarks.bench_xla_dots [--rounds N] [--calls N]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

from benchmarks import machine
from benchmarks.timing import interleaved_medians

# (rows, inputs, outputs) of Dense layers in benchmarks/bench_training.py.
SHAPES = (
    (256, 512, 512),  # small MLP
    (1024, 64, 256),  # small DeepNorm, first FFN layer
    (1024, 256, 64),  # small DeepNorm, second FFN layer
    (2048, 128, 512),  # medium DeepNorm, first FFN layer
    (2048, 512, 128),  # medium DeepNorm, second FFN layer
    (3200, 64, 512),  # small LN-LSTM, hoisted input projection
)
PRODUCTS = {
    "forward x @ W": lambda x, w, dy: tf.matmul(x, w),
    "input grad dy @ W^T": lambda x, w, dy: tf.matmul(dy, w, transpose_b=True),
    "kernel grad x^T @ dy": lambda x, w, dy: tf.matmul(x, dy, transpose_a=True),
}


def timed(fn, args, calls):
    import time

    def run():
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args).numpy()
        return (time.perf_counter() - start) / calls

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    print(machine.header())
    print(f"{'rows x in -> out':<18} {'product':<22} {'XLA ms':>7} {'TF ms':>7} XLA/TF")
    for rows, n_in, n_out in SHAPES:
        x = tf.random.normal((rows, n_in))
        w = tf.random.normal((n_in, n_out))
        dy = tf.random.normal((rows, n_out))
        for name, product in PRODUCTS.items():
            candidates = {}
            for jit in (True, False):
                fn = tf.function(product, jit_compile=jit)
                fn(x, w, dy).numpy()  # trace and compile
                candidates[jit] = timed(fn, (x, w, dy), args.calls)
            times = interleaved_medians(candidates, args.rounds)
            print(
                f"{f'{rows}x{n_in}->{n_out}':<18} {name:<22} "
                f"{times[True] * 1e3:7.3f} {times[False] * 1e3:7.3f} "
                f"{times[True] / times[False]:6.2f}"
            )


if __name__ == "__main__":
    main()
