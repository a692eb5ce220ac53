"""Training-step speed of kerasnorm.training: XLA, no XLA, "measure", Keras' default.

Four model families (MLP + LayerNorm, CNN + GroupNorm, LN-LSTM, DeepNorm
encoder stack) train with Adam. Per family, one model of each kind trains
side by side, interleaved round by round (benchmarks/timing.py), medians
kept:

- `xla` / `no_xla` / `norms`: `kerasnorm.training.compile(jit_compile=True /
  False / "norms")` (`norms`: XLA for the normalization layers only; not for
  the LN-LSTM, which has none);
- `measure`: `kerasnorm.training.compile(jit_compile="measure", sample=...)`,
  which picked one of the three on the sample batch;
- `keras_auto`: plain `model.compile()` (`jit_compile="auto"`, no XLA on a
  CPU-only machine);
- `bf16_xla` / `bf16_no_xla`: the same model under `mixed_bfloat16`.

Also printed: the first step's time (tracing and XLA compilation), and with
`--distributed` the training throughput on two logical CPU devices
(MirroredStrategy) and on two worker processes (MultiWorkerMirroredStrategy
on loopback ports) against one device, measured in subprocesses.

Usage: python -m benchmarks.bench_training [--rounds N] [--steps N]
       [--families mlp cnn lstm deepnorm] [--sizes small medium] [--distributed]
"""

import argparse
import contextlib
import json
import math
import os
import socket
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


from benchmarks import machine
from benchmarks import rerun
from benchmarks.timing import interleaved_medians
from benchmarks.training_models import FAMILIES
from benchmarks.training_models import SIZES
from benchmarks.training_models import compiled


def timed_steps(model, sample, steps):
    def run():
        start = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(*sample)
        return (time.perf_counter() - start) / steps

    return run


def bench_family(family, size, rounds, steps):
    kinds = ["xla", "no_xla", "norms", "measure", "keras_auto"]
    kinds += ["bf16_xla", "bf16_no_xla"]
    if family == "lstm":
        kinds.remove("norms")  # no normalization layer: equals no_xla
    candidates, first, measured = {}, {}, None
    for kind in kinds:
        start = time.perf_counter()
        model, sample = compiled(family, kind, size)
        if kind == "measure":
            measured = model.jit_compile_measurement
            first["measure_compile"] = time.perf_counter() - start
        start = time.perf_counter()
        model.train_on_batch(*sample)
        first[kind] = time.perf_counter() - start
        candidates[kind] = timed_steps(model, sample, steps)
    times = interleaved_medians(candidates, rounds)
    return times, first, measured


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def distributed_child(mode, family, rounds, steps):
    """Runs in a subprocess: seconds per step of a global batch, JSON out."""
    import tensorflow as tf

    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    candidates = {}
    for name, scope in (("one", contextlib.nullcontext()), ("two", strategy.scope())):
        if mode == "worker" and name == "one":
            continue  # one process is measured by the parent, alone
        with scope:
            model, sample = compiled(family, "xla")
        model.train_on_batch(*sample)
        candidates[name] = timed_steps(model, sample, steps)
    print(json.dumps(interleaved_medians(candidates, rounds)))


def run_children(family, rounds, steps):
    args = [family, str(rounds), str(steps)]
    env = rerun.environment(TF_CPP_MIN_LOG_LEVEL="3")
    mirrored = subprocess.run(
        rerun.command(__spec__, "--child", "mirrored", *args),
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=True,
    )
    mirrored = json.loads(mirrored.stdout.strip().splitlines()[-1])
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    try:
        for index in range(2):
            config = {
                "cluster": {"worker": workers},
                "task": {"type": "worker", "index": index},
            }
            processes.append(
                subprocess.Popen(
                    rerun.command(__spec__, "--child", "worker", *args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=dict(env, TF_CONFIG=json.dumps(config)),
                )
            )
        outputs = [p.communicate(timeout=900)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    two_workers = json.loads(outputs[0].strip().splitlines()[-1])["two"]
    model, sample = compiled(family, "xla")
    model.train_on_batch(*sample)
    one_process = interleaved_medians(
        {"one": timed_steps(model, sample, steps)}, rounds
    )
    return mirrored, two_workers, one_process["one"]


def _geomean(gains, size=None):
    values = [g for (s, _), g in gains.items() if size in (None, s)]
    return math.exp(sum(map(math.log, values)) / len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES)
    parser.add_argument(
        "--sizes", nargs="+", choices=tuple(SIZES), default=("small", "medium")
    )
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument(
        "--child", nargs=4, metavar=("MODE", "FAMILY", "ROUNDS", "STEPS")
    )
    args = parser.parse_args()
    if args.child:
        mode, family, rounds, steps = args.child
        distributed_child(mode, family, int(rounds), int(steps))
        return

    print(machine.header(load_tensorflow=True))
    print(f"rounds {args.rounds}, {args.steps} steps per measurement; ms per step")
    gains = {}
    for size in args.sizes:
        print(f"\n{size} models")
        print(
            "| family | XLA | no XLA | XLA for norms only | measure (choice) "
            "| Keras auto | measure / fastest | Keras auto / measure "
            "| first step XLA / no XLA (s) | bf16 / fp32, XLA | bf16 / fp32, no XLA |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for family in args.families:
            t, first, measured = bench_family(family, size, args.rounds, args.steps)
            fastest = min(t[k] for k in ("xla", "no_xla", "norms") if k in t)
            gains[size, family] = t["keras_auto"] / t["measure"]
            choice = {True: "XLA", False: "no XLA", "norms": "norms"}
            norms = f"{t['norms'] * 1e3:.1f}" if "norms" in t else "n/a"
            print(
                f"| {family} | {t['xla'] * 1e3:.1f} | {t['no_xla'] * 1e3:.1f} "
                f"| {norms} | {t['measure'] * 1e3:.1f} "
                f"({choice[measured.jit_compile]}) | {t['keras_auto'] * 1e3:.1f} "
                f"| {t['measure'] / fastest:.2f} "
                f"| {gains[size, family]:.2f}x "
                f"| {first['xla']:.1f} / {first['no_xla']:.1f} "
                f"| {t['bf16_xla'] / t['xla']:.2f} "
                f"| {t['bf16_no_xla'] / t['no_xla']:.2f} |",
                flush=True,
            )
        print(f"geometric mean, Keras auto / measure: {_geomean(gains, size):.2f}x")
    if len(args.sizes) > 1:
        print(f"geometric mean over all sizes: {_geomean(gains):.2f}x")

    if args.distributed:
        print("\n| family | 2 logical devices / 1 device | 2 workers / 1 process |")
        print("|---|---|---|")
        for family in args.families:
            mirrored, two_workers, one_process = run_children(
                family, args.rounds, args.steps
            )
            print(
                f"| {family} | {mirrored['one'] / mirrored['two']:.2f}x "
                f"| {one_process / two_workers:.2f}x |",
                flush=True,
            )
        print("(throughput ratios: > 1 means the distributed run trains faster)")


if __name__ == "__main__":
    main()
