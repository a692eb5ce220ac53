"""Parts 3 and 4 of export/bench_ondevice.py: fast int8 and streaming int8.

Part 3, int8 against float32 per norm. The issue-28 models (64x64x3, three
Conv2D 32-64-128 with GroupNorm(8) / LayerNorm / RMSNorm + ReLU, GAP,
Dense; two Pre-LN and two DeepNorm `TransformerEncoderBlock`s of 64 tokens
x 128), random weights and norm parameters, each as float32, as the
full-integer file (`to_tflite(quantize="int8", int8_io=True)`, what
`quantize="int8"` wrote before issue 28) and as the fast int8 file
(`to_tflite(quantize="int8")`: norm statistics, `MEAN`, batched matmuls,
softmax and GELU in float, `kerasnorm.export.tflite.selective`): latency,
int8 / float32, XNNPACK partitions and the ops left out
(`Verification.delegation`), rms error against Keras, size against float32.

Part 4, streaming int8 against sequence length. A LayerNormLSTM(32) trained
on the digits' rows upsampled to 28 steps, exported as a streaming step
file per mode (float32, dynamic, full-integer int8 (`int8_io=True`),
int16x8, and int8 with a
float state: `to_tflite(streaming=True, quantize="int8")`, 4000
calibration steps), run from zero states over
the test digits upsampled to 8, 28, 64 and 128 steps: rms error of the last
step's logits against the Keras model, test accuracy at 28 steps,
partitions, size and step latency.

Latency here is the interpreter thread's CPU time (`time.thread_time`),
not wall time: LiteRT on one thread computes in the calling thread, so the
other jobs of a shared machine do not count, and two interpreters over one
file agree to a few percent where wall-clock medians differed 2x. Every
candidate of a row is timed in the same interleaved rounds; medians.
"""

import os
import time

import keras
import numpy as np

import kerasnorm
from benchmarks.timing import interleaved_medians
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.tflite.selective import float_compute_ops
from kerasnorm.export.verify.delegation import delegation

L = keras.layers
BURST_CPU_SECONDS = 0.01
LENGTHS = (8, 28, 64, 128)
QUICK_LENGTHS = (8, 28)


# Part 3 -------------------------------------------------------------------


def conv_net(norm, side, widths):
    inputs = keras.Input((side, side, 3), name="image")
    x = inputs
    for width, stride in zip(widths, (1, 2, 2), strict=True):
        x = L.Conv2D(width, 3, strides=stride, padding="same")(x)
        x = L.ReLU()(norm()(x))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def encoder(position, steps, width, layers):
    inputs = keras.Input((steps, width), name="tokens")
    x = inputs
    for _ in range(layers):
        x = kerasnorm.TransformerEncoderBlock(
            num_heads=4,
            key_dim=width // 4,
            intermediate_dim=2 * width,
            norm_position=position,
            num_layers=layers,
        )(x)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def int8_models(quick):
    """{name: builder}; `--quick`: 16x16 images, 8-16-32 channels, one
    block of 8 tokens x 16."""
    side, widths = (16, (8, 16, 32)) if quick else (64, (32, 64, 128))
    steps, width, layers = (8, 16, 1) if quick else (64, 128, 2)
    models = {
        "conv + GroupNorm(8)": lambda: conv_net(
            lambda: kerasnorm.GroupNorm(4 if quick else 8), side, widths
        ),
        "conv + LayerNorm": lambda: conv_net(kerasnorm.LayerNorm, side, widths),
        "conv + RMSNorm": lambda: conv_net(kerasnorm.RMSNorm, side, widths),
        f"{layers} Pre-LN blocks, {steps}x{width}": lambda: encoder(
            "pre", steps, width, layers
        ),
        f"{layers} DeepNorm blocks, {steps}x{width}": lambda: encoder(
            "deepnorm", steps, width, layers
        ),
    }
    if quick:  # one conv net per kind of statistics, one encoder
        return {k: v for i, (k, v) in enumerate(models.items()) if i in (0, 1, 3)}
    return models


def randomize_norms(model, seed=0):
    """Norm scales in [0.5, 1.5] and offsets ~ N(0, 0.2): a freshly built
    norm's ones and zeros would hide what quantizing the affine costs."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        name = weight.path.rsplit("/", 1)[-1]
        if name in ("gamma", "scale"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
        elif name in ("beta", "offset"):
            weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))


def cpu_timer(call, x):
    """A zero-argument timer: the thread's CPU seconds per call, over a
    burst of calls long enough for the clock."""
    call(x)
    start, calls = time.thread_time(), 0
    while time.thread_time() - start < BURST_CPU_SECONDS:
        call(x)
        calls += 1
    n = max(calls, 1)

    def measure():
        start = time.thread_time()
        for _ in range(n):
            call(x)
        return (time.thread_time() - start) / n

    return measure


def _rms_rel(want, got):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def int8_row(name, build, args, workdir, lite_file):
    keras.utils.set_random_seed(0)
    model = build()
    randomize_norms(model)
    rng = np.random.default_rng(1)
    shape = model.inputs[0].shape[1:]
    calibration = rng.standard_normal((args.calibration, *shape)).astype("float32")
    check = rng.standard_normal((args.check, *shape)).astype("float32")
    want = model.predict(check, verbose=0, batch_size=32)
    float_path = os.path.join(workdir, "f32.tflite")
    int8_path = os.path.join(workdir, "int8.tflite")
    fast_path = int8_path.replace(".tflite", "_fast.tflite")
    to_tflite(model, float_path, overwrite=True)
    for path, int8_io in ((int8_path, True), (fast_path, False)):
        to_tflite(
            model,
            path,
            quantize="int8",
            int8_io=int8_io,
            representative_data=calibration,
            calibration_samples=len(calibration),
            overwrite=True,
        )
    contents = {
        "float32": _read(float_path),
        "int8": _read(int8_path),
        "fast int8": _read(fast_path),
    }
    files = {key: lite_file(content) for key, content in contents.items()}
    timers = {key: cpu_timer(file, check[:1]) for key, file in files.items()}
    ms = interleaved_medians(timers, args.repeats)
    row = {"model": name}
    for key, content in contents.items():
        report = delegation(content)
        row[key] = {
            "ms": 1e3 * ms[key],
            "ratio": ms[key] / ms["float32"],
            "rms_rel": _rms_rel(want, files[key].predict(check)),
            "size_ratio": len(content) / len(contents["float32"]),
            "partitions": report.partitions,
            "undelegated": report.undelegated,
            "delegation": str(report),
        }
    row["fast int8"]["float_ops"] = float_compute_ops(contents["fast int8"])
    return row


def int8_table(rows):
    lines = [
        "| model | float32 ms | int8 ms | int8 / float32 | int8 partitions | "
        "int8 rms err | fast int8 ms | fast int8 / float32 | fast partitions | "
        "fast rms err | fast size / float32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        f32, i8, fast = row["float32"], row["int8"], row["fast int8"]
        lines.append(
            f"| {row['model']} | {f32['ms']:.3f} | {i8['ms']:.3f} | "
            f"{i8['ratio']:.2f} | {i8['partitions']} | {i8['rms_rel']:.3f} | "
            f"{fast['ms']:.3f} | {fast['ratio']:.2f} | {fast['partitions']} | "
            f"{fast['rms_rel']:.3f} | {fast['size_ratio']:.2f} |"
        )
        notes.append(
            f"{row['model']}: float32 {f32['delegation']}; int8 "
            f"{i8['delegation']}; fast int8 {fast['delegation']}, in float: "
            + ", ".join(f"{op} {n}" for op, n in fast["float_ops"].items())
        )
    return "\n".join(lines + [""] + [f"- {note}" for note in notes])


# Part 4 -------------------------------------------------------------------


def upsample(x, steps):
    """Sequences `(n, time, features)` resampled to `steps` steps by linear
    interpolation along time."""
    source = np.linspace(0, 1, x.shape[1])
    target = np.linspace(0, 1, steps)
    flat = x.transpose(0, 2, 1).reshape(-1, x.shape[1])
    out = np.stack([np.interp(target, source, row) for row in flat])
    return out.reshape(x.shape[0], x.shape[2], steps).transpose(0, 2, 1)


def _stream_logits(content, sequences):
    runner = litert.StreamingRunner(content)
    logits = []
    for i in range(len(sequences)):
        runner.reset()
        logits.append(runner.run(sequences[i : i + 1])[0][:, -1])
    return np.concatenate(logits), runner


def streaming_rows(args, digits, train, workdir):
    """The per-mode rows of the streaming table (see the module docstring)."""
    x_train, y_train, x_test, y_test = digits
    if args.quick:
        x_train, y_train, x_test, y_test = (
            x_train[:256],
            y_train[:256],
            x_test[:64],
            y_test[:64],
        )
    units, epochs, n_eval = (8, 1, 16) if args.quick else (32, 15, 120)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    train_28 = upsample(x_train, 28).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, x_train.shape[2]), name="sequence")
    model = keras.Model(inputs, L.Dense(10)(kerasnorm.LayerNormLSTM(units)(inputs)))
    train(model, train_28, y_train, epochs)
    tests = {n: upsample(x_test, n).astype("float32") for n in lengths}
    wants = {n: np.asarray(model.predict(tests[n], verbose=0)) for n in lengths}
    path = os.path.join(workdir, "step.tflite")

    def export(**kwargs):
        to_tflite(
            model,
            path,
            streaming=True,
            overwrite=True,
            tolerance=float("inf"),  # measured here, not gated on
            verify_inputs=tests[28][:8],
            **kwargs,
        )
        return _read(path)

    calibration = {"representative_data": train_28[: args.calibration]}
    files = {"float32": export()}
    files["dynamic"] = export(quantize="dynamic")
    files["int8"] = export(quantize="int8", int8_io=True, **calibration)
    files["int16x8"] = export(quantize="int16x8", **calibration)
    samples = 200 if args.quick else 4000
    files["int8, float state"] = export(
        quantize="int8", representative_data=train_28, calibration_samples=samples
    )
    rows = {"keras accuracy": float(np.mean(wants[28].argmax(-1) == y_test))}
    steppers = {}
    for mode, content in files.items():
        cell = {"size_kib": round(len(content) / 1024, 1)}
        for n in lengths:
            got, runner = _stream_logits(content, tests[n][:n_eval])
            cell[f"rms@{n}"] = _rms_rel(wants[n][:n_eval], got)
        got, runner = _stream_logits(content, tests[28])
        cell["accuracy"] = float(np.mean(got.argmax(-1) == y_test))
        cell["delegation"] = str(delegation(content))
        cell["partitions"] = delegation(content).partitions
        rows[mode] = cell
        steppers[mode] = runner
    frame = tests[28][:1, 0]
    timers = {m: cpu_timer(r.step, frame) for m, r in steppers.items()}
    for mode, seconds in interleaved_medians(timers, args.repeats).items():
        rows[mode]["step_ms"] = 1e3 * seconds
    return {"model": f"LayerNormLSTM({units}), digits rows at 28 steps", **rows}


def streaming_table(row):
    lengths = [k[4:] for k in row["float32"] if k.startswith("rms@")]
    lines = [
        "| mode | "
        + " | ".join(f"rms err {n} steps" for n in lengths)
        + " | accuracy (28 steps) | partitions | size KiB | step ms |",
        "|---|" + "---|" * (len(lengths) + 4),
        f"| Keras | {' | '.join('-' for _ in lengths)} | "
        f"{row['keras accuracy']:.4f} | - | - | - |",
    ]
    for mode, cell in row.items():
        if not isinstance(cell, dict):
            continue
        errors = " | ".join(f"{cell[f'rms@{n}']:.4f}" for n in lengths)
        lines.append(
            f"| {mode} | {errors} | {cell['accuracy']:.4f} | {cell['partitions']} "
            f"| {cell['size_kib']} | {cell['step_ms']:.4f} |"
        )
    return "\n".join(lines)
