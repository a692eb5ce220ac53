"""Forward + backward speed of kerasnorm's norm layers vs the Keras built-ins.

For each shape the same input and output gradient go through a
`tf.function(jit_compile=True)` (XLA) computing the gradients of x, gamma and
beta for that output gradient (what training needs of a norm layer). The
layers of one shape are timed in interleaved rounds and the median per-call
time kept (timing.py), so load from other processes hits them alike:

- LayerNorm and RMSNorm shapes: kerasnorm's LayerNorm and RMSNorm and Keras'
  LayerNormalization and RMSNormalization, all four interleaved, so that the
  LayerNorm / RMSNorm ratio comes from the same rounds as the Keras ratios;
- GroupNorm shapes (8 groups): kerasnorm's GroupNorm and Keras'
  GroupNormalization.

TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` once, at import, so each setting
(`--onednn 0 1` by default) runs in its own subprocess. Printed per row:
kerasnorm's and Keras' time, their ratio (< 1: kerasnorm is faster) and, for
LayerNorm, its ratio to kerasnorm's RMSNorm on the same shape. `--graph`
adds the same rows without XLA.

Usage: python -m benchmarks.bench_norms [--quick] [--repeats N] [--calls N]
       [--onednn 0 1] [--graph]
"""

import argparse
import subprocess
import time

from benchmarks import machine
from benchmarks import rerun

LN_SHAPES = ((4096, 1024), (256, 4096), (32, 128, 512))
GN_SHAPES = ((16, 32, 32, 64), (32, 56, 56, 64))
QUICK_LN_SHAPES = ((512, 256), (4, 32, 64))
QUICK_GN_SHAPES = ((4, 16, 16, 32),)
GROUPS = 8


def candidates(family):
    import keras

    import kerasnorm

    if family == "ln":
        return {
            "LayerNorm": lambda: kerasnorm.LayerNorm(),
            "keras LayerNormalization": lambda: keras.layers.LayerNormalization(
                epsilon=1e-5
            ),
            "RMSNorm": lambda: kerasnorm.RMSNorm(),
            "keras RMSNormalization": lambda: keras.layers.RMSNormalization(
                epsilon=1e-6
            ),
        }
    return {
        "GroupNorm": lambda: kerasnorm.GroupNorm(groups=GROUPS),
        "keras GroupNormalization": lambda: keras.layers.GroupNormalization(
            GROUPS, epsilon=1e-5
        ),
    }


def make_step(layer, shape, jit):
    import tensorflow as tf

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


def measure(family, shape, jit, args):
    """Median seconds per call of each candidate of `family` on `shape`."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.timing import interleaved_medians

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape).astype("float32"))
    dy = tf.constant(rng.standard_normal(shape).astype("float32"))
    steps = {
        name: make_step(build(), shape, jit)
        for name, build in candidates(family).items()
    }
    for step in steps.values():
        time_calls(step, x, dy, 2)  # trace, compile, warm up
    return interleaved_medians(
        {
            name: lambda step=step: time_calls(step, x, dy, args.calls)
            for name, step in steps.items()
        },
        args.repeats,
    )


def child(args):
    import tensorflow  # noqa: F401  (loaded: the header reads its oneDNN state)

    print(f"\n{machine.header()}")
    header = (
        f"{'layer':<10} {'shape':<14} {'xla':<5} {'kerasnorm ms':>12} "
        f"{'keras ms':>9} {'ratio':>6} {'LN/RMS':>7}"
    )
    print(header)
    print("-" * len(header))
    ln_shapes = QUICK_LN_SHAPES if args.quick else LN_SHAPES
    gn_shapes = QUICK_GN_SHAPES if args.quick else GN_SHAPES
    rows = [("ln", s) for s in ln_shapes] + [("gn", s) for s in gn_shapes]
    for jit in (True, False) if args.graph else (True,):
        for family, shape in rows:
            t = measure(family, shape, jit, args)
            pairs = (
                [
                    ("LayerNorm", "keras LayerNormalization"),
                    ("RMSNorm", "keras RMSNormalization"),
                ]
                if family == "ln"
                else [("GroupNorm", "keras GroupNormalization")]
            )
            for ours, theirs in pairs:
                extra = ""
                if ours == "LayerNorm":
                    extra = f"{t['LayerNorm'] / t['RMSNorm']:>7.2f}"
                print(
                    f"{ours:<10} {'x'.join(map(str, shape)):<14} {jit!s:<5} "
                    f"{t[ours] * 1e3:>12.3f} {t[theirs] * 1e3:>9.3f} "
                    f"{t[ours] / t[theirs]:>6.2f} {extra}",
                    flush=True,
                )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--repeats", type=int, default=15, help="rounds (median)")
    parser.add_argument("--calls", type=int, default=5, help="calls per round")
    parser.add_argument(
        "--onednn",
        nargs="+",
        choices=("0", "1"),
        default=("0", "1"),
        help="TF_ENABLE_ONEDNN_OPTS settings, one subprocess each",
    )
    parser.add_argument("--graph", action="store_true", help="also without XLA")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    command = rerun.command(__spec__, "--child")
    command += ["--repeats", str(args.repeats), "--calls", str(args.calls)]
    command += ["--quick"] * args.quick + ["--graph"] * args.graph
    for setting in args.onednn:
        env = rerun.environment(TF_ENABLE_ONEDNN_OPTS=setting)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
