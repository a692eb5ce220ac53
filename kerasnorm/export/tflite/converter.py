"""The converter's options and its calibration feed: one of each for every
TFLite path (whole model or streaming step)."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerasnorm.export._common.modes import FULL_INTEGER_MODES


def converter_options(
    quantize, int8_io, calibration=None, *, batch_size=1, progress=False
):
    """`litert.convert`'s keyword arguments for `quantize`: optimizations,
    types, and for a full-integer mode the calibration generator over
    `calibration` ({signature name: samples}, see `calibration_feed`)."""
    kwargs = {}
    if quantize is not None:
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        kwargs["supported_types"] = [tf.float16]
    if quantize in FULL_INTEGER_MODES:
        kwargs["full_integer"] = True
        kwargs["representative_dataset"] = calibration_feed(
            calibration, batch_size, progress
        )
    if quantize == "int16x8":
        kwargs["int16_activations"] = True
    if quantize == "int8" and int8_io:
        kwargs["inference_input_type"] = tf.int8
        kwargs["inference_output_type"] = tf.int8
    return kwargs


def calibration_feed(calibration, batch_size, progress):
    """The converter's calibration generator: batches of `calibration`
    ({signature name: samples}, whole batches already), one dict each."""
    n = len(next(iter(calibration.values())))

    def generate():
        bar = None
        if progress:
            print(f"Calibrating int8 on {n} samples:")
            bar = keras.utils.Progbar(n, unit_name="sample")
        for i in range(0, n, batch_size):
            yield {name: x[i : i + batch_size] for name, x in calibration.items()}
            if bar is not None:
                bar.update(i + batch_size)

    return generate
