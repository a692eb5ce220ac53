"""Part 2 of bench_ondevice.py: recurrent layers in every quantize mode.

A LayerNormLSTM and a LayerNormGRU trained on two tasks (the digits' rows;
the sign of a running sum), each exported in every mode of
`kerasnorm.export.QUANTIZE_MODES`: test accuracy, rms error against the
Keras logits, size, converter time and latency.
"""

import os
import time

import keras
import numpy as np

import kerasnorm
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import data
from export import files
from export import models
from kerasnorm.export import QUANTIZE_MODES
from kerasnorm.export import litert

CELLS = (kerasnorm.LayerNormLSTM, kerasnorm.LayerNormGRU)


def tasks(quick):
    """{name: (data, units, epochs)}, data `(x_train, y_train, x_test,
    y_test)`; with `quick` a few samples, 8 steps, 8 units, one epoch."""
    digits = data.digits_rows()
    if quick:
        digits = (digits[0][:128], digits[1][:128], digits[2][:64], digits[3][:64])
        return {
            "digits rows (8x8)": (digits, 8, 1),
            "running sum (8x2)": (data.running_sum(128, 64, 8), 8, 1),
        }
    # 32 units for 64 steps: converting the unrolled int8 file takes about
    # as long per step as per unit.
    return {
        "digits rows (8x8)": (digits, 64, 15),
        "running sum (64x2)": (data.running_sum(1024, 512, 64), 32, 10),
    }


def train_recurrent(quick):
    """{label: (trained model, x_train, y_train, x_test, y_test)}."""
    trained = {}
    for number, (task, (task_data, units, epochs)) in enumerate(tasks(quick).items()):
        x_train, y_train, x_test, y_test = task_data
        # --quick trains one cell per task: each cell and each task once.
        cells = CELLS[number % 2 :][:1] if quick else CELLS
        for cls in cells:
            keras.utils.set_random_seed(0)
            steps, features = x_train.shape[1:]
            classes = int(y_train.max()) + 1
            model = models.recurrent(cls, units, steps, features, classes)
            start = time.perf_counter()
            models.train(model, x_train, y_train, epochs)
            label = f"{cls.__name__}({units}), {task}"
            print(
                f"trained {label} for {epochs} epochs in "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
            trained[label] = (model, x_train, y_train, x_test, y_test)
    return trained


def _export(model, path, mode, calibration, check):
    """(bytes, seconds, how it was unrolled): where `to_tflite` refuses to
    unroll a mode itself, a copy built with `unroll=True` by hand."""
    try:
        result, content, seconds = files.kerasnorm_export(
            model, path, mode, calibration, check
        )
        return content, seconds, "by to_tflite" if result.unrolled else "no"
    except ValueError as err:
        if "unroll" not in str(err):
            raise
    copy = models.unrolled_copy(model)
    _, content, seconds = files.kerasnorm_export(copy, path, mode, calibration, check)
    return content, seconds, "by hand"


def every_mode(label, model, x_train, x_test, y_test, args, workdir):
    """The row of one trained model: Keras' accuracy, then one cell per
    quantize mode (`error` where the export failed)."""
    want = model.predict(x_test, verbose=0, batch_size=64)
    row = {"float": {"accuracy": float(np.mean(want.argmax(-1) == y_test))}}
    runners = {}
    calibration = x_train[: args.calibration]
    for mode in QUANTIZE_MODES:
        key = mode or "float32"
        path = os.path.join(workdir, f"{key}.tflite")
        try:
            content, seconds, unrolled = _export(
                model, path, mode, calibration, x_test[: args.check]
            )
            run = files.runner(content)
            got = files.first_output(run, x_test)
            row[key] = {
                "unrolled": unrolled,
                "accuracy": float(np.mean(got.argmax(-1) == y_test)),
                "rms_rel": files.errors(want, got)["rms_rel"],
                "size_kib": round(len(content) / 1024, 1),
                "ops": sum(litert.op_counts(content).values()),
                "convert_s": round(seconds, 1),
            }
            runners[key] = run
        except Exception as err:
            row[key] = {"error": files.error_text(err)}
    timers = {key: burst_timer(run, x_test[:1]) for key, run in runners.items()}
    for key, seconds in interleaved_medians(timers, args.repeats).items():
        row[key]["ms"] = 1e3 * seconds
    return {"model": label, **row}
