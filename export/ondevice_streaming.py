"""Part 4 of bench_ondevice.py: streaming int8 against sequence length.

A LayerNormLSTM(32) trained on the digits' rows upsampled to 28 steps,
exported as a streaming step file per mode (float32, dynamic, full-integer
int8 (`int8_io=True`), int16x8, and int8 with a float state:
`to_tflite(streaming=True, quantize="int8")`, 4000 calibration steps), run
from zero states over the test digits upsampled to 8, 28, 64 and 128 steps:
rms error of the last step's logits against the Keras model, test accuracy
at 28 steps, XNNPACK partitions, size and step latency (thread CPU time, as
in part 3).
"""

import os

import keras
import numpy as np

import kerasnorm
from benchmarks.timing import interleaved_medians
from export import data
from export import files
from export import models
from export.ondevice_int8 import cpu_timer
from kerasnorm.export import to_tflite

LENGTHS = (8, 28, 64, 128)
QUICK_LENGTHS = (8, 28)


def _stream_logits(content, sequences):
    """The last step's logits of each sequence, each from zero states; and
    the runner (its states now those of the last sequence)."""
    runner = files.streaming_runner(content)
    logits = []
    for i in range(len(sequences)):
        runner.reset()
        logits.append(runner.run(sequences[i : i + 1])[0][:, -1])
    return np.concatenate(logits), runner


def _quick(digits, quick):
    if not quick:
        return digits
    x_train, y_train, x_test, y_test = digits
    return x_train[:256], y_train[:256], x_test[:64], y_test[:64]


def streaming_rows(args, workdir):
    """The per-mode cells of the streaming table (see the module docstring)."""
    x_train, y_train, x_test, y_test = _quick(data.digits_rows(), args.quick)
    units, epochs, n_eval = (8, 1, 16) if args.quick else (32, 15, 120)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    train_28 = data.upsample(x_train, 28).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, x_train.shape[2]), name="sequence")
    outputs = keras.layers.Dense(10)(kerasnorm.LayerNormLSTM(units)(inputs))
    model = keras.Model(inputs, outputs)
    models.train(model, train_28, y_train, epochs)
    tests = {n: data.upsample(x_test, n).astype("float32") for n in lengths}
    wants = {n: np.asarray(model.predict(tests[n], verbose=0)) for n in lengths}
    path = os.path.join(workdir, "step.tflite")

    def export(**kwargs):
        result = to_tflite(
            model,
            path,
            streaming=True,
            batch_size=1,
            overwrite=True,
            tolerance=float("inf"),  # measured here, not gated on
            verify_inputs=tests[28][:8],
            **kwargs,
        )
        return result, files.read(path)

    calibration = {"representative_data": train_28[: args.calibration]}
    exported = {"float32": export()}
    exported["dynamic"] = export(quantize="dynamic")
    exported["int8"] = export(quantize="int8", int8_io=True, **calibration)
    exported["int16x8"] = export(quantize="int16x8", **calibration)
    samples = 200 if args.quick else 4000
    exported["int8, float state"] = export(
        quantize="int8", representative_data=train_28, calibration_samples=samples
    )
    rows = {"keras accuracy": float(np.mean(wants[28].argmax(-1) == y_test))}
    steppers = {}
    for mode, (result, content) in exported.items():
        report = result.verification.delegation
        cell = {"size_kib": round(len(content) / 1024, 1)}
        for n in lengths:
            got, _ = _stream_logits(content, tests[n][:n_eval])
            cell[f"rms@{n}"] = files.errors(wants[n][:n_eval], got)["rms_rel"]
        got, steppers[mode] = _stream_logits(content, tests[28])
        cell["accuracy"] = float(np.mean(got.argmax(-1) == y_test))
        cell["delegation"] = str(report)
        cell["partitions"] = report.partitions
        rows[mode] = cell
    frame = tests[28][:1, 0]
    timers = {mode: cpu_timer(runner.step, frame) for mode, runner in steppers.items()}
    for mode, seconds in interleaved_medians(timers, args.repeats).items():
        rows[mode]["step_ms"] = 1e3 * seconds
    return {"model": f"LayerNormLSTM({units}), digits rows at 28 steps", **rows}
