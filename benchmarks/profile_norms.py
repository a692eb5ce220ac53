"""Per-kernel profile of the XLA:CPU forward + backward of one norm layer.

Compiles the step `benchmarks/bench_norms.py` times (y and the gradients of x,
gamma and beta for a given output gradient, `jit_compile=True`), dumps its
optimized HLO and times every kernel of the compiled program with the
TensorFlow profiler (`--xla_cpu_enable_xprof_traceme`: one trace event per
thunk, named after the HLO instruction), as `benchmarks/profile_recurrent.py`
does for the recurrent layers.

Printed per layer: the number of fusions, the time per step of each kernel,
its output shape, and the fused computation's root instructions (what the
kernel computes, in short).

Usage: python -m benchmarks.profile_norms [--layers ln keras_ln ...]
       [--shape 4096 1024] [--groups 8] [--steps N] [--keep DIR]
"""

import argparse
import os
import re
import shutil
import subprocess
import tempfile

from benchmarks import machine
from benchmarks import rerun
from benchmarks.profiling import parse_hlo
from benchmarks.profiling import parse_trace
from benchmarks.profiling import xla_flags

LAYERS = ("ln", "keras_ln", "rms", "keras_rms", "gn", "keras_gn")


def _layer(name, groups):
    import keras

    import kerasnorm

    return {
        "ln": lambda: kerasnorm.LayerNorm(),
        "keras_ln": lambda: keras.layers.LayerNormalization(epsilon=1e-5),
        "rms": lambda: kerasnorm.RMSNorm(),
        "keras_rms": lambda: keras.layers.RMSNormalization(epsilon=1e-6),
        "gn": lambda: kerasnorm.GroupNorm(groups=groups),
        "keras_gn": lambda: keras.layers.GroupNormalization(groups, epsilon=1e-5),
    }[name]()


def _fusion_roots(text):
    """Map fused computation name -> a short description of what it computes
    (the kinds of its instructions, in order, without parameters/constants)."""
    out, current, kinds = {}, None, []
    for line in text.splitlines():
        header = re.match(r"^%?([\w.\-]+) \(.*\{$", line)
        if header:
            current, kinds = header.group(1), []
            continue
        inst = re.match(r"^\s+(?:ROOT )?%?[\w.\-]+ = \S+ ([\w\-]+)\(", line)
        if inst and current:
            kind = inst.group(1)
            if kind not in ("parameter", "constant", "bitcast", "broadcast"):
                kinds.append(kind)
        if line.startswith("}") and current:
            out[current] = " ".join(kinds)
            current = None
    return out


def profile(name, args, workdir):
    import glob

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    shape = tuple(args.shape)
    layer = _layer(name, args.groups)
    layer.build(shape)
    variables = layer.trainable_variables

    @tf.function(jit_compile=True)
    def norm_step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        return tape.gradient(y, [x, *variables], output_gradients=dy)

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape).astype("float32"))
    dy = tf.constant(rng.standard_normal(shape).astype("float32"))
    for _ in range(2):
        norm_step(x, dy)[0].numpy()
    trace_dir = os.path.join(workdir, "trace")
    tf.profiler.experimental.start(trace_dir)
    for _ in range(args.steps):
        norm_step(x, dy)[0].numpy()
    tf.profiler.experimental.stop()

    (dump,) = glob.glob(
        os.path.join(workdir, "hlo", "*norm_step*after_optimizations.txt")
    )
    text = open(dump).read()
    instructions, _ = parse_hlo(dump)
    calls = dict(re.findall(r"%?([\w.\-]+) = \S+ fusion\(.*?calls=%?([\w.\-]+)", text))
    roots = _fusion_roots(text)
    total, _ = parse_trace(trace_dir)
    kernels = {n: total[n] for n in total if n in instructions}
    kernels = {n: ps for n, ps in kernels.items() if instructions[n][0] == "entry"}
    whole = sum(kernels.values())
    print(
        f"\n== {name} {shape}: {len(kernels)} kernels, "
        f"{whole / 1e9 / args.steps:.2f} ms/step in kernels"
    )
    for n, ps in sorted(kernels.items(), key=lambda kv: -kv[1]):
        _, out_shape, kind, _ = instructions[n]
        what = roots.get(calls.get(n, ""), kind)
        print(f"{ps / 1e9 / args.steps:8.2f} ms  {n:<22} {out_shape:<34} {what}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layers", nargs="+", choices=LAYERS, default=["ln", "keras_ln", "rms"]
    )
    parser.add_argument("--shape", nargs="+", type=int, default=(4096, 1024))
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="profiled steps")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--keep", help="directory for the dump and trace")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        profile(args.child, args, args.keep)
        return
    print(machine.header(load_tensorflow=True))
    root = args.keep or tempfile.mkdtemp(prefix="profile_norms_")
    for name in args.layers:
        workdir = os.path.join(root, name)
        shutil.rmtree(workdir, ignore_errors=True)  # one dump and trace each
        os.makedirs(workdir, exist_ok=True)
        env = rerun.environment(
            TF_CPP_MIN_LOG_LEVEL="3",
            XLA_FLAGS=xla_flags(workdir),
        )
        command = rerun.command(__spec__, "--child", name, "--keep", workdir)
        command += ["--steps", str(args.steps), "--threads", str(args.threads)]
        command += ["--groups", str(args.groups), "--shape", *map(str, args.shape)]
        subprocess.run(command, env=env, check=True)
    print(f"\ndump and trace in {root}")


if __name__ == "__main__":
    main()
