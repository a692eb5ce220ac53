"""`export(model, path, format=...)`, the one door named as Keras' exporter:
each format gives what its documented shortcut gives (`to_tflite`,
`to_saved_model`), and the table of formats is the one place a format's
layout is decided."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasnorm
from kerasnorm.export import EXPORT_FORMATS
from kerasnorm.export import export
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.options.formats import FORMATS
from kerasnorm.export.options.formats import format_of_artifact

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), name="features")
    x = keras.layers.Dense(8)(inputs)
    x = kerasnorm.LayerNorm()(x)
    outputs = keras.layers.Dense(3, name="scores")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).standard_normal((16, 6)).astype("float32")


def test_formats_are_named_as_keras_names_them():
    assert EXPORT_FORMATS == ("litert", "tf_saved_model", "litert_lm")
    assert FORMATS["litert"].suffix == ".tflite"
    assert FORMATS["tf_saved_model"].is_directory
    # A generative file may end in `.tflite` too; looked up by its suffix,
    # a `.tflite` is litert's, a `.litertlm` is no shared verifier's.
    generative = FORMATS["litert_lm"]
    assert generative.suffix_of("a.tflite") == ".tflite"
    assert generative.suffix_of("a.litertlm") == ".litertlm"
    assert format_of_artifact("a.tflite") is FORMATS["litert"]
    with pytest.raises(ValueError, match=r"a \.tflite file or a SavedModel"):
        format_of_artifact("a.litertlm")


def test_litert_through_the_door_is_to_tflite(model, data, tmp_path):
    door = export(
        model,
        tmp_path / "door.tflite",
        format="litert",
        quantize="dynamic",
        verify_inputs=data,
    )
    short = to_tflite(model, tmp_path / "short.tflite", quantize="dynamic",
                      verify_inputs=data)  # fmt: skip
    assert door.kind == short.kind == "tflite"
    assert door.quantize == short.quantize == "dynamic"
    assert door.verification.passed and short.verification.passed
    assert door.verification.ops == short.verification.ops
    assert door.fold_report.affines == short.fold_report.affines
    (got,) = litert.Runner(open(door.path, "rb").read()).predict(data)
    (want,) = litert.Runner(open(short.path, "rb").read()).predict(data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Both independent of each other: the file against the Keras model.
    scale = np.max(np.abs(model.predict(data, verbose=0)))
    assert np.max(np.abs(got - model.predict(data, verbose=0))) < 0.05 * scale


# Two SavedModel exports, each loaded again in the fresh-process loader.
@pytest.mark.slow
def test_tf_saved_model_through_the_door_is_to_saved_model(model, data, tmp_path):
    door = export(model, tmp_path / "door", format="tf_saved_model",
                  verify_inputs=data)  # fmt: skip
    short = to_saved_model(model, tmp_path / "short", verify_inputs=data)
    assert door.kind == short.kind == "saved_model"
    # The versioned layout: <path>/1/, then the next version.
    assert door.path == os.path.join(tmp_path / "door", "1")
    assert short.path == os.path.join(tmp_path / "short", "1")
    # The next export there is version 2 (the layout is the row's).
    row = FORMATS["tf_saved_model"]
    assert row.target(tmp_path / "door") == os.path.join(tmp_path / "door", "2")
    assert row.target(tmp_path / "door", 7) == os.path.join(tmp_path / "door", "7")
    outputs = [
        tf.saved_model.load(p)
        .signatures["serving_default"](features=tf.constant(data))["scores"]
        .numpy()
        for p in (door.path, short.path)
    ]
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        outputs[0], model.predict(data, verbose=0), rtol=1e-4, atol=1e-5
    )


def test_the_door_refuses_before_any_work(model, tmp_path):
    with pytest.raises(ValueError, match="format should be one of"):
        export(model, tmp_path / "m.onnx", format="onnx")
    # An option the format does not take, as a function refuses a keyword.
    with pytest.raises(TypeError, match="format='tf_saved_model' takes no option"):
        export(model, tmp_path / "sm", format="tf_saved_model", quantize="int8")
    with pytest.raises(ValueError, match=r"path should end in '\.tflite'"):
        export(model, tmp_path / "m.keras", format="litert")
    with pytest.raises(ValueError, match="should be a directory"):
        export(model, tmp_path / "m.tflite", format="tf_saved_model")
    assert not os.listdir(tmp_path)


def test_an_artifact_is_told_by_its_layout(tmp_path):
    file = tmp_path / "m.tflite"
    file.write_bytes(b"")
    assert format_of_artifact(file).name == "litert"
    assert format_of_artifact(tmp_path).name == "tf_saved_model"
    with pytest.raises(ValueError, match=r"artifact should be a \.tflite file"):
        format_of_artifact(tmp_path / "m.onnx")
