"""Per-kernel profile of one XLA:CPU training step of a recurrent layer.

Compiles the training step of `Input -> layer (last output) -> MSE` with Adam
and `jit_compile=True` at the benchmark's standard shape (batch 64, 100 steps,
input 128, units 256), dumps its optimized HLO, and times every kernel
("thunk") of the compiled program with the TensorFlow profiler: XLA:CPU
records one trace event per thunk when `--xla_cpu_enable_xprof_traceme` is
on, named after the HLO instruction, so each event maps back to the fusion or
dot it ran and to the computation holding it (the entry computation, the
forward time loop's body or the backward one's).

Printed, per layer: the number of kernels in each while-loop body, the time
per training step spent in each computation, and the top kernels with their
time per training step, the number of calls per step, the output shape and
the TensorFlow op they came from (`op_name` in the HLO metadata).

Usage: python -m benchmarks.profile_recurrent [--layers lnlstm lstm ...]
       [--steps N] [--top N] [--keep DIR] [--shape BATCH TIME FEATURES UNITS]

The environment variable XLA_FLAGS is set by the script (the dump and the
trace flags); the trace and the dump are written to a temporary directory
(`--keep DIR` keeps them).
"""

import argparse
import collections
import glob
import os
import re
import tempfile

from benchmarks import machine
from benchmarks import rerun
from benchmarks.profiling import parse_hlo
from benchmarks.profiling import parse_trace
from benchmarks.profiling import xla_flags

LAYERS = ("lnlstm", "lstm", "lngru", "gru")
# Thunks that only move or wrap buffers, and the events of the runtime around
# the kernels: not kernels of the program.
_RUNTIME_EVENTS = re.compile(
    r"ThunkExecutor|SlinkyThreadPool|^while(\.\d+)?$|^call(\.\d+)?$"
    r"|^conditional(\.\d+)?$"
)


def _layer(name, units):
    import keras

    import kerasnorm

    return {
        "lnlstm": lambda: kerasnorm.LayerNormLSTM(units),
        "lstm": lambda: keras.layers.LSTM(units),
        "lngru": lambda: kerasnorm.LayerNormGRU(units),
        "gru": lambda: keras.layers.GRU(units),
    }[name]()


def _role(computation, bodies):
    if computation == "entry":
        return "outside loops"
    if computation in bodies:
        return "loop body " + ("bwd" if "grad" in computation else "fwd")
    return computation


def profile(name, args, workdir):
    import keras
    import numpy as np
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    batch, steps, features, units = args.shape
    keras.utils.set_random_seed(0)
    inputs = keras.Input((steps, features), batch_size=batch)
    model = keras.Model(inputs, _layer(name, units)(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, features)).astype("float32")
    y = rng.standard_normal((batch, units)).astype("float32")
    for _ in range(2):
        model.train_on_batch(x, y)
    trace_dir = os.path.join(workdir, f"trace_{name}")
    tf.profiler.experimental.start(trace_dir)
    for _ in range(args.steps):
        model.train_on_batch(x, y)
    tf.profiler.experimental.stop()

    dumps = sorted(
        glob.glob(
            os.path.join(workdir, "hlo", "*one_step_on_data*after_optimizations.txt")
        ),
        key=os.path.getmtime,
    )
    instructions, bodies = parse_hlo(dumps[-1])
    total, count = parse_trace(trace_dir)
    kernels = {
        n: (total[n], count[n])
        for n in total
        if n in instructions and not _RUNTIME_EVENTS.search(n)
    }
    per_step = args.steps
    print(f"\n== {name}: {os.path.basename(dumps[-1])}")
    for body, kinds in bodies.items():
        kinds = collections.Counter(kinds)
        print(
            f"{_role(body, bodies)}: {kinds['fusion']} fusions, {kinds['dot']} dots, "
            f"{kinds['copy']} copies, {sum(kinds.values())} instructions"
        )
    by_role = collections.Counter()
    for n, (ps, _) in kernels.items():
        by_role[_role(instructions[n][0], bodies)] += ps
    whole = sum(by_role.values())
    for role, ps in by_role.most_common():
        print(
            f"{role:<16} {ps / 1e9 / per_step:8.2f} ms/step  {100 * ps / whole:5.1f}%"
        )
    print(f"{'all kernels':<16} {whole / 1e9 / per_step:8.2f} ms/step")
    print(f"{'ms/step':>8} {'calls':>6}  {'where':<15} {'kernel':<36} {'shape':<22} op")
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]
    for n, (ps, calls) in ranked:
        comp, shape, _, op = instructions[n]
        print(
            f"{ps / 1e9 / per_step:8.2f} {calls // per_step:6d}  "
            f"{_role(comp, bodies):<15} {n:<36} {shape:<22} {op}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=list(LAYERS))
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument("--keep", help="directory for the dump and trace")
    parser.add_argument(
        "--shape",
        nargs=4,
        type=int,
        default=(64, 100, 128, 256),
        metavar=("BATCH", "TIME", "FEATURES", "UNITS"),
        help="the input and the layer's units (default: 64 100 128 256)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (1: kernels run one at a time, so their times "
        "add up to the step; 0: TensorFlow's default)",
    )
    parser.add_argument(
        "--child", help=argparse.SUPPRESS
    )  # one layer per process: one XLA_FLAGS dump each
    args = parser.parse_args()
    if args.child:
        profile(args.child, args, args.keep)
        return
    import subprocess

    print(machine.header(load_tensorflow=True))
    root = args.keep or tempfile.mkdtemp(prefix="profile_recurrent_")
    for name in args.layers:
        workdir = os.path.join(root, name)
        os.makedirs(workdir, exist_ok=True)
        env = rerun.environment(
            TF_CPP_MIN_LOG_LEVEL="3",
            XLA_FLAGS=xla_flags(workdir),
        )
        command = rerun.command(__spec__, "--child", name, "--keep", workdir)
        command += ["--steps", str(args.steps), "--top", str(args.top)]
        command += ["--threads", str(args.threads)]
        command += ["--shape", *map(str, args.shape)]
        subprocess.run(command, env=env, check=True)
    print(f"\ndump and trace in {root}")


if __name__ == "__main__":
    main()
