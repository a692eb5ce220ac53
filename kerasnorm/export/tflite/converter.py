"""The converter's options and its calibration feed: one of each for every
TFLite path (whole model or streaming step), read from the mode's `Mode`."""

from __future__ import annotations

import sys

import keras
import tensorflow as tf


def converter_options(prepared, mode):
    """`litert.convert`'s keyword arguments for `mode` (`modes.Mode`; None
    for the float32 file the fast int8 writers quantize): optimizations,
    types, and for a full-integer mode the calibration generator over
    `prepared.calibration`."""
    options = prepared.options
    kwargs = {}
    if mode.optimizes:
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if mode.weights == "float16":
        kwargs["supported_types"] = [tf.float16]
    if mode.calibrates:
        kwargs["full_integer"] = True
        kwargs["representative_dataset"] = calibration_feed(
            prepared.calibration,
            prepared.batch_size or 1,
            options.progress,
            mode=mode.name,
        )
    if mode.int16_activations:
        kwargs["int16_activations"] = True
    if mode.fast_int8 and options.int8_io:
        kwargs["inference_input_type"] = tf.int8
        kwargs["inference_output_type"] = tf.int8
    return kwargs


def calibration_feed(calibration, batch_size, progress, mode="int8"):
    """The converter's calibration generator: batches of `calibration`
    ({signature name: samples}, whole batches already), one dict each.

    With `progress`, a line naming `mode` and the sample count, and on a
    terminal a progress bar under it; piped (a log file, CI), the line
    alone: a bar's carriage returns and colour codes would garble it."""
    n = len(next(iter(calibration.values())))

    def generate():
        bar = None
        if progress:
            terminal = sys.stdout.isatty()
            print(f"Calibrating {mode} on {n} samples{':' if terminal else '.'}")
            if terminal:
                bar = keras.utils.Progbar(n, unit_name="sample")
        for i in range(0, n, batch_size):
            yield {name: x[i : i + batch_size] for name, x in calibration.items()}
            if bar is not None:
                bar.update(i + batch_size)

    return generate
