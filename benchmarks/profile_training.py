"""Where the training benchmark's steps spend their time: products vs the rest.

For each family and size of bench_training.py (training_models.py), traces
a few training steps without XLA and with XLA on one thread (intra- and
inter-op parallelism 1, so kernels run one after another and their times add
up to the step) with the
TensorFlow profiler, and splits the kernel time into matrix products and
convolutions ("products": MatMul, BatchMatMul, Conv2D and their gradients, or
XLA's `dot` and `convolution` kernels) and the rest of the step (every other
kernel and the runtime's overhead: step time minus product time).

Printed per row: the step time of each mode, its product time and the rest,
and the *ceiling*: no-XLA step / no-XLA product time, the speed-up over no
XLA that a mode would reach if it made every other kernel and all overhead
free while running the products as fast as TensorFlow's oneDNN kernels do.
XLA:CPU's own products are no faster (the convolutions and the
weight-gradient products are slower: benchmarks/bench_xla_dots.py), so no
choice of compilation mode can beat this ceiling on this CPU.

Usage: python -m benchmarks.profile_training [--families ...] [--sizes ...]
       [--steps N]

Each (family, size, mode) runs in its own process: XLA_FLAGS (the HLO dump
and the per-kernel trace events, as in profile_recurrent.py) must be set
before TensorFlow starts.
"""

import argparse
import json
import math
import os
import re
import subprocess
import tempfile
import time

from benchmarks import machine
from benchmarks import rerun
from benchmarks.profiling import xla_flags
from benchmarks.training_models import FAMILIES
from benchmarks.training_models import SIZES

# TensorFlow op types (oneDNN's renamed kernels included) that are products.
_TF_PRODUCT = re.compile(r"MatMul|Conv2D|Conv3D|DepthwiseConv|Einsum")
# Events of the runtime around the kernels, not kernels.
_TF_RUNTIME = re.compile(
    r"^(ExecutorState|EagerExecute|EagerKernelExecute|EagerLocalExecute|"
    r"KernelAndDeviceFunc|TFE_|FunctionRun|one_step_on_data|tf\.constant)"
)
# Ops whose event spans the kernels of a function or loop body they run.
_TF_CONTROL_FLOW = re.compile(r"^(Stateless)?(While|If|Case)$|PartitionedCall$")
_XLA_PRODUCT_KINDS = ("dot", "convolution")


def _tf_products(total):
    """Picoseconds in the TensorFlow op events `name:OpType` of products."""
    products = 0
    for name, ps in total.items():
        if _TF_RUNTIME.search(name) or ":" not in name:
            continue
        op_type = name.rsplit(":", 1)[1]
        if not _TF_CONTROL_FLOW.search(op_type) and _TF_PRODUCT.search(op_type):
            products += ps
    return products


def _xla_products(total, instructions):
    """Picoseconds in the XLA thunk events (HLO instruction names) of
    products: `dot` and `convolution` instructions, and fusions around one."""
    products = 0
    for name, ps in total.items():
        if name not in instructions:
            continue
        kind = instructions[name][2]
        fused_product = kind == "fusion" and ("dot" in name or "convolution" in name)
        if kind in _XLA_PRODUCT_KINDS or fused_product:
            products += ps
    return products


def child(family, size, mode, steps, workdir):
    import glob

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from benchmarks.profiling import parse_hlo
    from benchmarks.profiling import parse_trace
    from benchmarks.training_models import compiled

    model, sample = compiled(family, mode, size)
    for _ in range(3):
        model.train_on_batch(*sample)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(*sample)
        times.append(time.perf_counter() - start)
    trace_dir = os.path.join(workdir, "trace")
    tf.profiler.experimental.start(trace_dir)
    for _ in range(steps):
        model.train_on_batch(*sample)
    tf.profiler.experimental.stop()
    total, _ = parse_trace(trace_dir)
    if mode == "xla":
        dumps = glob.glob(
            os.path.join(workdir, "hlo", "*one_step_on_data*after_optimizations.txt")
        )
        instructions, _ = parse_hlo(max(dumps, key=os.path.getmtime))
        products = _xla_products(total, instructions)
    else:
        products = _tf_products(total)
    step = sorted(times)[len(times) // 2]
    products = products / 1e12 / steps
    print(json.dumps({"step": step, "products": products, "rest": step - products}))


def run(family, size, mode, steps):
    with tempfile.TemporaryDirectory(prefix="profile_training_") as workdir:
        env = rerun.environment(TF_CPP_MIN_LOG_LEVEL="3")
        if mode == "xla":
            env["XLA_FLAGS"] = xla_flags(workdir)
        command = rerun.command(__spec__, "--child")
        command += [family, size, mode, str(steps), workdir]
        out = subprocess.run(
            command, env=env, check=True, capture_output=True, text=True
        ).stdout
        return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES)
    parser.add_argument(
        "--sizes", nargs="+", choices=tuple(SIZES), default=tuple(SIZES)
    )
    parser.add_argument("--steps", type=int, default=5, help="steps timed/traced")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        family, size, mode, steps, workdir = args.child
        child(family, size, mode, int(steps), workdir)
        return
    print(machine.header(load_tensorflow=True))
    print("one thread; ms per training step (median of the timed steps);")
    print("products = matmul/conv kernels, rest = step - products")
    print(
        f"{'size':<7} {'family':<9} {'no XLA':>7} {'products':>9} {'rest':>6}"
        f" {'XLA':>6} {'products':>9} {'rest':>6} {'XLA gain':>8} {'ceiling':>8}"
    )
    gains, ceilings = [], []
    for size in args.sizes:
        for family in args.families:
            plain = run(family, size, "no_xla", args.steps)
            xla = run(family, size, "xla", args.steps)
            gain = plain["step"] / xla["step"]
            ceiling = plain["step"] / plain["products"]
            gains.append(max(gain, 1.0))
            ceilings.append(ceiling)
            print(
                f"{size:<7} {family:<9} {plain['step'] * 1e3:7.1f} "
                f"{plain['products'] * 1e3:9.1f} {plain['rest'] * 1e3:6.1f} "
                f"{xla['step'] * 1e3:6.1f} {xla['products'] * 1e3:9.1f} "
                f"{xla['rest'] * 1e3:6.1f} {gain:7.2f}x {ceiling:7.2f}x"
            )
    geo = lambda values: math.exp(sum(map(math.log, values)) / len(values))  # noqa: E731
    print(
        f"geometric mean: faster of XLA / no XLA {geo(gains):.2f}x, "
        f"ceiling {geo(ceilings):.2f}x"
    )


if __name__ == "__main__":
    main()
