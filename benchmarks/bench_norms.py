"""Forward + backward speed of kerasnorm's norm layers vs the Keras built-ins.

For each layer pair the same input and output gradient go through a
`tf.function` computing y and (dL/dx, dL/dgamma, dL/dbeta), with
`jit_compile=True` (XLA) and without. Calls of the two layers are interleaved
round by round and the median per-call time is kept, so load from other
processes hits both sides alike. Printed per row:

- ratio = kerasnorm time / Keras time (< 1: kerasnorm is faster);
- achieved bandwidth: the minimum traffic of a fused forward + backward (read x,
  write y; read x and dy, write dx: 5 tensors) divided by the time, as a
  fraction of a measured large memcpy (read + write).

Usage: python benchmarks/bench_norms.py [--quick] [--repeats N]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import kerasnorm
from kerasnorm._timing import interleaved_medians


def pairs(quick):
    ln_shape = (512, 256) if quick else (4096, 1024)
    gn_shape = (4, 16, 16, 32) if quick else (16, 32, 32, 64)
    return [
        (
            "LayerNorm",
            ln_shape,
            lambda: kerasnorm.LayerNorm(),
            lambda: keras.layers.LayerNormalization(epsilon=1e-5),
        ),
        (
            "RMSNorm",
            ln_shape,
            lambda: kerasnorm.RMSNorm(),
            lambda: keras.layers.RMSNormalization(epsilon=1e-6),
        ),
        (
            "GroupNorm",
            gn_shape,
            lambda: kerasnorm.GroupNorm(groups=8),
            lambda: keras.layers.GroupNormalization(groups=8, epsilon=1e-5),
        ),
    ]


def make_step(layer, shape, jit):
    layer.build(shape)
    variables = layer.trainable_variables

    @tf.function(jit_compile=jit)
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        return tape.gradient(y, [x, *variables], output_gradients=dy)

    return step


def time_calls(step, x, dy, calls):
    start = time.perf_counter()
    for _ in range(calls):
        out = step(x, dy)
    out[0].numpy()  # wait for the last call
    return (time.perf_counter() - start) / calls


def memcpy_bandwidth(nbytes, repeats):
    src = np.random.default_rng(0).standard_normal(nbytes // 4).astype("float32")
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--repeats", type=int, default=15, help="rounds (median)")
    parser.add_argument("--calls", type=int, default=5, help="calls per round")
    args = parser.parse_args()

    copy_bw = memcpy_bandwidth(64 * 2**20, args.repeats)
    print(f"memcpy bandwidth (numpy, read+write): {copy_bw / 1e9:.1f} GB/s")
    header = (
        f"{'layer':<10} {'shape':<18} {'xla':<5} {'kerasnorm ms':>12} "
        f"{'keras ms':>9} {'ratio':>6} {'ours %bw':>8} {'keras %bw':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, shape, ours_fn, theirs_fn in pairs(args.quick):
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal(shape).astype("float32"))
        dy = tf.constant(rng.standard_normal(shape).astype("float32"))
        traffic = 5 * x.numpy().nbytes
        for jit in (True, False):
            steps = {
                "ours": make_step(ours_fn(), shape, jit),
                "theirs": make_step(theirs_fn(), shape, jit),
            }
            for step in steps.values():
                time_calls(step, x, dy, 2)  # trace, compile, warm up
            medians = interleaved_medians(
                {
                    key: lambda step=step, x=x, dy=dy: time_calls(
                        step, x, dy, args.calls
                    )
                    for key, step in steps.items()
                },
                args.repeats,
            )
            ours, theirs = medians["ours"], medians["theirs"]
            print(
                f"{name:<10} {'x'.join(map(str, shape)):<18} {jit!s:<5} "
                f"{ours * 1e3:>12.3f} {theirs * 1e3:>9.3f} {ours / theirs:>6.2f} "
                f"{100 * traffic / ours / copy_bw:>7.0f}% "
                f"{100 * traffic / theirs / copy_bw:>8.0f}%"
            )


if __name__ == "__main__":
    main()
