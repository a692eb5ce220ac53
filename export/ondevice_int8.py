"""Part 3 of bench_ondevice.py: int8 against float32 per norm.

The issue-28 models (64x64x3, three Conv2D 32-64-128 with GroupNorm(8) /
LayerNorm / RMSNorm + ReLU, GAP, Dense; two Pre-LN and two DeepNorm
`TransformerEncoderBlock`s of 64 tokens x 128), random weights and norm
parameters, each as float32, as the full-integer file
(`to_tflite(quantize="int8", int8_io=True)`) and as the fast int8 file
(`to_tflite(quantize="int8")`: the ops XNNPACK has no int8 kernel for in
float, `ExportResult.float_ops`): latency, int8 / float32, XNNPACK
partitions and the ops left out (`Verification.delegation`), rms error
against Keras, size against float32.

Latency is the interpreter thread's CPU time (`time.thread_time`), not wall
time: LiteRT on one thread computes in the calling thread, so the other
jobs of a shared machine do not count, and two interpreters over one file
agree to a few percent where wall-clock medians differed 2x. Every
candidate of a row is timed in the same interleaved rounds; medians.
"""

import os
import time

import keras
import numpy as np

import kerasnorm
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import files
from export import models

# Thread CPU time has a coarser clock than wall time: longer bursts.
BURST_CPU_SECONDS = 0.01
# name -> (quantize, int8_io) of the three files of a row.
FILES = {"float32": (None, False), "int8": ("int8", True), "fast int8": ("int8", False)}


def cpu_timer(call, x):
    """A timer of `call(x)` in the calling thread's CPU seconds per call."""
    return burst_timer(call, x, seconds=BURST_CPU_SECONDS, clock=time.thread_time)


def int8_models(quick):
    """{name: builder}; `quick`: 16x16 images, 8-16-32 channels, one block
    of 8 tokens x 16, one conv net per kind of statistics and one encoder."""
    side, widths = (16, (8, 16, 32)) if quick else (64, (32, 64, 128))
    steps, width, layers = (8, 16, 1) if quick else (64, 128, 2)
    groups = 4 if quick else 8
    builders = {
        "conv + GroupNorm(8)": lambda: models.conv_net(
            lambda: kerasnorm.GroupNorm(groups), side, widths
        ),
        "conv + LayerNorm": lambda: models.conv_net(kerasnorm.LayerNorm, side, widths),
        "conv + RMSNorm": lambda: models.conv_net(kerasnorm.RMSNorm, side, widths),
        f"{layers} Pre-LN blocks, {steps}x{width}": lambda: models.encoder(
            "pre", steps, width, layers
        ),
        f"{layers} DeepNorm blocks, {steps}x{width}": lambda: models.encoder(
            "deepnorm", steps, width, layers
        ),
    }
    if quick:
        return {k: v for i, (k, v) in enumerate(builders.items()) if i in (0, 1, 3)}
    return builders


def int8_row(name, build, args, workdir):
    """The row of one model: per file (`FILES`) latency, ratio to float32,
    rms error, size ratio and delegation; the fast file's float ops."""
    keras.utils.set_random_seed(0)
    model = build()
    models.randomize_norms(model)
    rng = np.random.default_rng(1)
    shape = model.inputs[0].shape[1:]
    calibration = rng.standard_normal((args.calibration, *shape)).astype("float32")
    check = rng.standard_normal((args.check, *shape)).astype("float32")
    want = model.predict(check, verbose=0, batch_size=32)
    results, contents = {}, {}
    for key, (mode, int8_io) in FILES.items():
        path = os.path.join(workdir, key.replace(" ", "_") + ".tflite")
        results[key], contents[key], _ = files.kerasnorm_export(
            model, path, mode, calibration, check, int8_io=int8_io
        )
    runners = {key: files.runner(content) for key, content in contents.items()}
    timers = {key: cpu_timer(run, check[:1]) for key, run in runners.items()}
    ms = interleaved_medians(timers, args.repeats)
    row = {"model": name}
    for key, content in contents.items():
        report = results[key].verification.delegation
        row[key] = {
            "ms": 1e3 * ms[key],
            "ratio": ms[key] / ms["float32"],
            "rms_rel": files.errors(want, files.first_output(runners[key], check))[
                "rms_rel"
            ],
            "size_ratio": len(content) / len(contents["float32"]),
            "partitions": report.partitions,
            "undelegated": report.undelegated,
            "delegation": str(report),
        }
    row["fast int8"]["float_ops"] = list(results["fast int8"].float_ops)
    return row
