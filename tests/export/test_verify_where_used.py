"""Artifacts checked where they are used (issue 34): a SavedModel run in a
fresh process, a layer no other process can run refused by name, and
conversion failures as one sentence naming the op and every layer that
creates it, the converter's text in `details`."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm.export import ExportConversionError
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify
from kerasnorm.export.litert.convert import concrete_function
from kerasnorm.export.model.op_layers import recording
from kerasnorm.export.tflite.explain import explain
from kerasnorm.export.tflite.explain import layers_creating
from kerasnorm.export.tflite.explain import ops_in_error
from kerasnorm.export.verify import fresh
from kerasnorm.export.verify.fresh import check_in_fresh_process

pytestmark = pytest.mark.tf_only

L = keras.layers


class _Doubled(L.Layer):
    """A layer as users write one around Python code: `tf.py_function`."""

    def call(self, x):
        y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
        y.set_shape(x.shape)
        return y


class _Spectral(L.Layer):
    """FNet's token mixing: the real part of a 2-D FFT."""

    def call(self, x):
        return x + tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64)))


def _py_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="x")
    y = _Doubled(name="doubled")(L.Dense(4, name="d1")(inputs))
    return keras.Model(inputs, L.Dense(2, name="out")(y))


def _one_sentence(text):
    """A message a user can act on: no MLIR, no traceback, one line."""
    assert "loc(" not in text and "Traceback" not in text, text
    assert "\n" not in text and len(text) < 600, text
    assert text.endswith("."), text


def test_py_function_layer_is_refused_by_name_for_a_saved_model(tmp_path):
    model = _py_model()
    x = np.random.default_rng(0).random((8, 4), "float32")
    with pytest.raises(ExportConversionError) as raised:
        to_saved_model(model, tmp_path / "serving", verify_inputs=x)
    text = str(raised.value)
    _one_sentence(text)
    assert text.startswith("Cannot export layer 'doubled' as a SavedModel")
    assert "EagerPyFunc" in text and "tf.py_function" in text
    assert not os.path.exists(tmp_path / "serving")


def test_py_function_layer_fails_tflite_in_one_sentence(tmp_path, capsys):
    model = _py_model()
    with pytest.raises(ExportConversionError) as raised:
        to_tflite(model, tmp_path / "m.tflite")
    text = str(raised.value)
    _one_sentence(text)
    assert text.startswith(
        "TFLite builtins cannot express EagerPyFunc, used by layer 'doubled':"
    )
    # The converter's own text is kept, not shown.
    assert "EagerPyFunc" in raised.value.details
    assert len(raised.value.details) > len(text)
    assert capsys.readouterr().err == ""
    with pytest.raises(ExportConversionError):
        to_tflite(model, tmp_path / "m.tflite", verbose=True)
    assert "The TFLite converter's output:" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "m.tflite")


def test_a_saved_model_that_fails_in_a_fresh_process_fails_verification(tmp_path):
    """Written around the refusal (Keras' own exporter), the SavedModel
    runs in this process, where the callback exists, and not in another."""
    model = _py_model()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        litert.SIGNATURE_KEY,
        lambda x: {"out": model(x)},
        input_signature=[tf.TensorSpec((None, 4), tf.float32, name="x")],
    )
    archive.write_out(str(tmp_path / "raw"), verbose=False)
    x = np.random.default_rng(0).random((8, 4), "float32")
    loaded = tf.saved_model.load(str(tmp_path / "raw"))
    in_process = loaded.signatures[litert.SIGNATURE_KEY](x=tf.constant(x))["out"]
    np.testing.assert_allclose(in_process, model(x), rtol=1e-6)
    with pytest.raises(ExportVerificationError) as raised:
        verify(model, tmp_path / "raw", x)
    text = str(raised.value)
    _one_sentence(text)
    assert "another Python process" in text
    assert "Could not find callback" in text and "tf.py_function" in text


def test_the_fresh_process_gives_the_saved_model_outputs(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, L.Dense(2, name="y")(inputs))
    result = to_saved_model(model, tmp_path / "serving")
    x = np.random.default_rng(1).random((5, 3), "float32")
    expected = {"y": np.asarray(model(x))}
    assert check_in_fresh_process(result.path, {"x": x}, expected) > 0
    # A process that computes something else is caught.
    wrong = {"y": expected["y"] + 1e-2 * np.abs(expected["y"]).max()}
    with pytest.raises(
        ExportVerificationError, match=r"computes something else.*output 'y'"
    ):
        check_in_fresh_process(result.path, {"x": x}, wrong)


def test_a_dead_loader_is_replaced_and_a_crash_is_reported(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, L.Dense(2, name="y")(inputs))
    path = to_saved_model(model, tmp_path / "serving").path
    x = np.ones((2, 3), "float32")
    first = fresh.loader()
    assert fresh.loader() is first  # one loader for the session's exports
    first._child.kill()
    first._child.wait()
    replaced = fresh.loader()
    assert replaced is not first and replaced.usable
    check_in_fresh_process(path, {"x": x}, {"y": np.asarray(model(x))})
    replaced._child.kill()
    with pytest.raises(ExportVerificationError, match="loading process died"):
        replaced.run(path, {"x": x})


def test_every_layer_creating_an_op_is_named():
    """Two layers of one class: TensorFlow's scopes put the first one's ops
    in scope `spectral_1`, the second's in `spectral_1_1`; the layers are
    told apart all the same, sublayers by their path."""
    inputs = keras.Input((8, 16))
    x = _Spectral(name="spectral")(inputs)
    x = _Spectral(name="spectral_1")(x)
    inner = keras.Sequential([_Spectral(name="deep")], name="stack")
    model = keras.Model(inputs, inner(x))
    assert layers_creating(model, {"FFT2D"}) == {
        "FFT2D": ["spectral", "spectral_1", "stack/deep"]
    }


def test_fnet_refusal_names_both_layers(tmp_path):
    inputs = keras.Input((8, 16))
    x = _Spectral(name="f_net_layer")(inputs)
    x = _Spectral(name="f_net_layer_1")(L.LayerNormalization()(x))
    model = keras.Model(inputs, x)
    with pytest.raises(ExportConversionError) as raised:
        to_tflite(model, tmp_path / "fnet.tflite")
    text = str(raised.value)
    _one_sentence(text)
    assert text.startswith(
        "TFLite builtins cannot express FFT2D, used by layers 'f_net_layer' and "
        "'f_net_layer_1':"
    )


class _BareErf(keras.layers.Layer):
    """An erf outside the GELU pattern the converter fuses."""

    def call(self, x):
        return keras.ops.erf(x) * 2.0 + x


@pytest.mark.parametrize("quantize", [None, "float16"])
def test_a_bare_erf_failure_names_the_layer(quantize, tmp_path):
    inputs = keras.Input((8, 16))
    x = _BareErf(name="erfy")(L.Dense(16)(inputs))
    model = keras.Model(inputs, L.Dense(2)(x))
    with pytest.raises(ExportConversionError) as raised:
        to_tflite(model, str(tmp_path / "m.tflite"), quantize=quantize)
    text = str(raised.value)
    _one_sentence(text)
    assert text.startswith("TFLite builtins cannot express Erf, used by layer 'erfy'")
    assert "keras.activations.gelu" in text and "approximate=True" in text
    assert "Erf" in raised.value.details
    assert not (tmp_path / "m.tflite").exists()


def test_a_converter_failure_without_a_layer_is_one_sentence():
    """The converter's error on the nine-line model of issue 33 as TF 2.21
    gave it when traced at batch 1 (the pipeline now traces it at a dynamic
    batch and it converts): the op, the converter's reason and what to try,
    in one sentence; the raw text in the details."""
    inputs = keras.Input((32, 1))
    x = L.Conv1D(4, 1, activation="relu")(inputs)
    model = keras.Model(inputs, L.Conv1D(1, 1)(x) + inputs)
    with recording(model) as ops:
        concrete_function(model, 1)
    raw = RuntimeError(
        'loc(callsite(fused["BiasAdd:", "functional_1/add/BiasAdd@__inference_'
        'serving_default_1"] at fused["PartitionedCall:", "PartitionedCall"]))'
        ": error: 'tf.Transpose' op x should be of the same rank with y, got x "
        "of rank 3, and y of rank 4"
    )
    err = explain(model, 1, raw, ops=ops)
    text = str(err)
    _one_sentence(text)
    assert text.startswith("The TFLite converter failed on Transpose")
    assert "(x should be of the same rank with y, got x of rank 3" in text
    assert "batch_size=2" in text
    assert "loc(" in err.details


def test_ops_in_error_reads_every_form():
    assert ops_in_error("TF Select ops: Conv2D, MatMul.") == (["Conv2D", "MatMul"], [])
    flex = (
        "ops that can be supported by the flex runtime (enabled via setting "
        "the -emit-select-tf-ops flag):\n\ttf.EagerPyFunc {Tin = [f32]}\n"
        '\ttf.FFT2D {device = ""}\n'
    )
    assert ops_in_error(flex) == (["EagerPyFunc", "FFT2D"], [])
    assert ops_in_error("'tf.Transpose' op x should be of the same rank") == (
        [],
        ["Transpose"],
    )


class _TimeEmbedding(L.Layer):
    """A diffusion model's sinusoidal time embedding: frequencies up to
    ~6,300 times a time step up to 1,000."""

    def call(self, t):
        top = float(np.log(6300.0))
        frequencies = keras.ops.exp(keras.ops.linspace(0.0, top, 16, dtype="float32"))
        return keras.ops.sin(t * frequencies)


def test_a_float16_failure_names_the_constants_it_rounded(tmp_path):
    keras.utils.set_random_seed(0)
    t = keras.Input((1,), name="t")
    model = keras.Model(t, L.Dense(4)(_TimeEmbedding(name="time_embedding")(t)))
    steps = np.random.default_rng(0).uniform(0, 1000, (64, 1)).astype("float32")
    # In float32 the file is right: the constants are what float16 breaks.
    assert to_tflite(model, tmp_path / "f32.tflite", verify_inputs=steps).verification
    with pytest.raises(ExportVerificationError) as raised:
        to_tflite(
            model, tmp_path / "f16.tflite", quantize="float16", verify_inputs=steps
        )
    text = str(raised.value)
    assert (
        "The file stores the constants of layer(s) 'time_embedding' in float16" in text
    )
    assert "up to 6.3e+03, where float16's spacing is 4" in text
    assert "quantize=None (float32) or 'dynamic'" in text
    # Right after the first sentence, before the figures.
    assert text.index("The file stores") < text.index("f16.tflite: tflite")
    assert not os.path.exists(tmp_path / "f16.tflite")


def test_a_logger_made_inside_a_capture_writes_to_stderr_after_it(capfd):
    """A handler bound to the capture's sink (TensorFlow's logger makes its
    own on first use) must not print "Logging error" once the sink is
    closed; it writes to stderr instead."""
    import logging

    from kerasnorm.export.litert.convert import stderr_captured

    logger = logging.getLogger("kerasnorm-test-capture")
    logger.propagate = False
    with stderr_captured(True):
        handler = logging.StreamHandler()  # binds sys.stderr: the sink
        logger.addHandler(handler)
        logger.warning("inside")
    try:
        logger.warning("after the capture")
    finally:
        logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "after the capture" in err
    assert "inside" not in err and "Logging error" not in err
