"""A quantized file that fails its check names the norms that normalize a
single value per sample (a norm over one channel: its output is its
offset, or for an RMS norm the sign of its input), and only those."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import to_tflite
from kerasnorm.export.verify.single_value import single_value_norms

pytestmark = pytest.mark.tf_only


def _model(channels):
    inputs = keras.Input((16, channels))
    x = kerasnorm.RMSNorm(name="one_value_rms")(inputs)
    x = keras.layers.Conv1D(4, 1, activation="relu")(x)
    x = kerasnorm.LayerNorm(name="four_values")(x)
    x = keras.layers.LayerNormalization(name="keras_ln")(x)
    x = kerasnorm.InstanceNorm(name="over_time")(x)
    x = kerasnorm.GroupNorm(groups=4, name="groups_of_one")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def test_norms_over_one_value_are_named_the_others_not():
    assert single_value_norms(_model(1).layers) == ["one_value_rms"]
    assert single_value_norms(_model(3).layers) == []


def test_group_and_instance_norms_over_one_value():
    inputs = keras.Input((1, 4))
    x = kerasnorm.InstanceNorm(name="length_one")(inputs)
    x = kerasnorm.GroupNorm(groups=-1, name="one_per_group")(x)
    x = kerasnorm.GroupNorm(groups=2, name="two_per_group")(x)
    x = keras.layers.LayerNormalization(axis=1, name="keras_over_length")(x)
    model = keras.Model(inputs, x)
    assert single_value_norms(model.layers) == [
        "length_one",
        "one_per_group",
        "keras_over_length",
    ]


def test_failed_int8_check_names_the_norm_over_one_value(tmp_path):
    model = _model(1)
    x = np.random.default_rng(0).normal(size=(64, 16, 1)).astype("float32")
    # A tolerance no int8 file meets, so that the check fails.
    with pytest.raises(ExportVerificationError, match="'one_value_rms' normalize"):
        to_tflite(
            model,
            tmp_path / "m.tflite",
            quantize="int8",
            representative_data=x,
            tolerance=1e-9,
        )
    assert not (tmp_path / "m.tflite").exists()
