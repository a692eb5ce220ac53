"""kerasnorm.legacy.layers: tf_keras twins of the Keras 3 norm layers."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

tf_keras = pytest.importorskip("tf_keras")
# kerasnorm.legacy imports on Keras' TensorFlow backend only.
if keras.backend.backend() != "tensorflow":
    pytest.skip("kerasnorm.legacy needs TensorFlow", allow_module_level=True)

import kerasnorm  # noqa: E402
from kerasnorm.legacy import layers as legacy  # noqa: E402
from tests.support.cases import CASE_NAMES  # noqa: E402
from tests.support.cases import PUBLIC_CLASSES  # noqa: E402
from tests.support.cases import case  # noqa: E402
from tests.support.cases import class_of  # noqa: E402
from tests.support.helpers import assert_twin_outputs  # noqa: E402

# tf_keras layers: TensorFlow.
pytestmark = pytest.mark.tf_only

# (class name, constructor arguments, input shape): every public norm layer,
# with the options that change its computation.
CASES = [
    ("LayerNorm", {}, (3, 5, 8)),
    ("LayerNorm", {"axis": [1, 2], "center": False}, (3, 5, 8)),
    ("RMSNorm", {}, (3, 5, 8)),
    ("RMSNorm", {"partial": 0.25, "center": True}, (3, 5, 8)),
    ("GroupNorm", {"groups": 4}, (3, 6, 6, 8)),
    ("GroupNorm", {"groups": 2, "axis": 1}, (3, 4, 5, 5)),
    ("InstanceNorm", {}, (3, 6, 6, 4)),
    ("InstanceNorm", {"axis": 1, "scale": False}, (3, 4, 5, 5)),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


def _pair(name, kwargs, shape, seed=0):
    """A built Keras 3 layer with random gamma/beta and its legacy twin with
    the same weights loaded."""
    rng = np.random.default_rng(seed)
    x = rng.normal(1.5, 3.0, shape).astype("float32")
    k3 = getattr(kerasnorm, name)(**kwargs)
    k3.build(shape)
    k3.set_weights([rng.normal(1.0, 0.5, w.shape) for w in k3.get_weights()])
    twin = getattr(legacy, name)(**kwargs)
    twin.build(shape)
    twin.set_weights(k3.get_weights())
    return x, k3, twin


@pytest.mark.parametrize(("name", "kwargs", "shape"), CASES, ids=IDS)
def test_same_weights_and_outputs(name, kwargs, shape):
    x, k3, twin = _pair(name, kwargs, shape)
    assert isinstance(twin, tf_keras.layers.Layer)
    assert [tuple(w.shape) for w in twin.weights] == [
        tuple(w.shape) for w in k3.weights
    ]
    assert [w.name.split(":")[0] for w in twin.weights] == [w.name for w in k3.weights]
    assert_twin_outputs(twin(x).numpy(), np.asarray(k3(x)))


@pytest.mark.parametrize(("name", "kwargs", "shape"), CASES, ids=IDS)
def test_same_config(name, kwargs, shape):
    _, k3, twin = _pair(name, kwargs, shape)
    k3_config, config = k3.get_config(), twin.get_config()
    del k3_config["dtype"], config["dtype"]  # policy object vs policy name
    k3_config.pop("name"), config.pop("name")
    assert config == k3_config
    rebuilt = type(twin).from_config(twin.get_config())
    assert rebuilt.get_config()["axis"] == kwargs.get("axis", -1)


def test_gradients_match():
    x, k3, twin = _pair("GroupNorm", {"groups": 2}, (2, 4, 4, 8))
    import tensorflow as tf

    with tf.GradientTape() as tape:
        y = twin(x)
        loss = tf.reduce_sum(y * y * np.arange(8, dtype="float32"))
    grads = tape.gradient(loss, twin.trainable_weights)
    with tf.GradientTape() as tape:
        y = k3(x)
        loss = tf.reduce_sum(y * y * np.arange(8, dtype="float32"))
    expected = tape.gradient(loss, [w.value for w in k3.trainable_weights])
    for g, e in zip(grads, expected, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)


def test_errors_are_the_keras3_ones():
    with pytest.raises(ValueError, match=r"groups=0"):
        legacy.GroupNorm(groups=0)
    with pytest.raises(ValueError, match=r"partial=1.5"):
        legacy.RMSNorm(partial=1.5)
    layer = legacy.GroupNorm(groups=3)
    with pytest.raises(ValueError, match=r"groups=3"):
        layer(np.zeros((1, 4, 4, 8), "float32"))


def _model():
    inputs = tf_keras.Input((6, 6, 8))
    x = tf_keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = legacy.GroupNorm(groups=4)(x)
    x = legacy.InstanceNorm()(x)
    x = tf_keras.layers.Flatten()(x)
    x = legacy.LayerNorm(gamma_regularizer="l2")(tf_keras.layers.Dense(16)(x))
    x = legacy.RMSNorm(partial=0.5)(x)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(3)(x))


@pytest.mark.parametrize("fmt", ["h5", "tf"])
def test_tf_keras_save_load_round_trip(tmp_path, fmt):
    x = np.random.default_rng(1).normal(size=(16, 6, 6, 8)).astype("float32")
    _assert_trained_round_trip(_model(), x, tmp_path, fmt, epochs=2)


def _assert_trained_round_trip(model, x, tmp_path, fmt, epochs):
    """Train `model` a little, save it as `fmt`, load it: the same layer
    classes and the same outputs."""
    model.compile(tf_keras.optimizers.Adam(1e-2), "mse")
    model.fit(x, np.ones((16, 3), "float32"), epochs=epochs, verbose=0)
    path = str(tmp_path / ("model.h5" if fmt == "h5" else "model"))
    model.save(path, save_format=fmt)
    loaded = tf_keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [
        type(layer) for layer in model.layers
    ]
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())


def test_importing_kerasnorm_leaves_tf_keras_and_tfmot_alone():
    code = (
        "import sys, os\n"
        "import kerasnorm, kerasnorm.export, kerasnorm.cli\n"
        "bad = {'tf_keras', 'tensorflow_model_optimization'} & set(sys.modules)\n"
        "assert not bad, bad\n"
        "assert 'TF_USE_LEGACY_KERAS' not in os.environ\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]


# Batch 3: test_recurrent_twins_match_with_mask_and_initial_state masks
# three sequences.
BATCH = 3


def _twins(name, seed=0):
    """The Keras 3 layer with random weights, its twin with them loaded, and
    inputs; fails when the class has no twin or no case here."""
    import keras

    twin_class = getattr(legacy, class_of(name), None)
    if twin_class is None:
        pytest.fail(
            f"kerasnorm.{class_of(name)} has no tf_keras twin: add one to "
            "kerasnorm.legacy.layers (a class over the same mixin)."
        )
    make, shapes = case(name).make, case(name).shapes
    rng = np.random.default_rng(seed)
    inputs = [rng.normal(0.5, 2.0, (BATCH, *s)).astype("float32") for s in shapes]
    k3 = make(getattr(kerasnorm.layers, class_of(name)), keras)
    twin = make(twin_class, tf_keras)
    k3(*inputs)
    twin(*inputs)
    k3.set_weights([rng.normal(0.3, 0.5, w.shape) for w in k3.get_weights()])
    twin.set_weights(k3.get_weights())
    return k3, twin, inputs


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_public_layer_has_a_matching_twin(name):
    import keras

    k3, twin, inputs = _twins(name)
    assert isinstance(twin, tf_keras.layers.Layer)
    assert [tuple(w.shape) for w in twin.weights] == [
        tuple(w.shape) for w in k3.weights
    ]
    expected = keras.tree.flatten(k3(*inputs))
    got = _flat(twin(*inputs))
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        assert_twin_outputs(g, e)


def _flat(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_twins_are_registered_and_share_the_config(name):
    twin_class = getattr(legacy, name)
    registered = tf_keras.saving.get_registered_object(f"kerasnorm>{name}")
    assert registered is twin_class
    k3, twin, _ = _twins(name)
    if name.endswith("Cell"):
        k3, twin = k3.cell, twin.cell
    assert type(twin) is twin_class
    k3_config, config = k3.get_config(), twin.get_config()
    for key, value in k3_config.items():
        # `tf_keras`'s RNN writes `zero_output_for_mask` only when True.
        skipped = ("dtype", "name", "zero_output_for_mask")
        if key not in skipped and not isinstance(value, dict):
            assert config[key] == value, key
    rebuilt = twin_class.from_config(twin.get_config()).get_config()
    assert {k: v for k, v in rebuilt.items() if not isinstance(v, dict)} == {
        k: v for k, v in config.items() if not isinstance(v, dict)
    }


def test_recurrent_twins_match_with_mask_and_initial_state():
    import tensorflow as tf

    k3, twin, (x,) = _twins("LayerNormGRU")
    mask = np.arange(6)[None, :] < np.array([[6], [3], [1]])
    state = np.random.default_rng(3).normal(size=(3, 4)).astype("float32")
    assert_twin_outputs(
        # `tf_keras`'s RNN takes initial states as tensors only.
        twin(x, mask=mask, initial_state=[tf.constant(state)]).numpy(),
        np.asarray(k3(x, mask=mask, initial_state=[state])),
    )


def test_recurrent_dropout_in_training_only():
    layer = legacy.LayerNormLSTM(4, dropout=0.5, recurrent_dropout=0.5, seed=1)
    x = np.random.default_rng(0).normal(size=(8, 5, 3)).astype("float32")
    inference = layer(x).numpy()
    np.testing.assert_array_equal(layer(x, training=False).numpy(), inference)
    assert not np.allclose(layer(x, training=True).numpy(), inference)


def test_twin_errors_are_the_keras3_ones():
    import keras

    with pytest.raises(ValueError, match=r"units=0"):
        legacy.LayerNormLSTM(0)
    with pytest.raises(ValueError, match=r"use_cudnn=True"):
        legacy.LayerNormGRU(4, use_cudnn=True)
    with pytest.raises(ValueError, match=r"must be a tf_keras.layers.Layer"):
        legacy.NormResidual(keras.layers.Dense(3))
    with pytest.raises(ValueError, match=r"WeightNorm` wraps one of .*Dense"):
        legacy.WeightNorm(keras.layers.Dense(3))
    with pytest.raises(ValueError, match=r"norm_position='middle'|middle"):
        legacy.TransformerEncoderBlock(2, 4, 8, norm_position="middle")


def _composite_model(cross_attention):
    sequence = tf_keras.Input((6, 5))
    source = tf_keras.Input((4, 8))
    x = legacy.LayerNormLSTM(8, return_sequences=True, dropout=0.2)(sequence)
    x = legacy.TransformerEncoderBlock(2, 4, 16, norm_position="deepnorm")(x)
    x = legacy.TransformerDecoderBlock(2, 4, 16)(x, source if cross_attention else None)
    x = legacy.NormResidual(tf_keras.layers.Dense(8), "post")(x)
    x = tf_keras.layers.RNN(legacy.LayerNormGRUCell(6))(x)
    outputs = legacy.WeightNorm(tf_keras.layers.Dense(3))(x)
    return tf_keras.Model([sequence, source] if cross_attention else sequence, outputs)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["h5", "tf"])
def test_composite_tf_keras_save_load_round_trip(tmp_path, fmt):
    rng = np.random.default_rng(2)
    x = [rng.normal(size=(16, 6, 5)), rng.normal(size=(16, 4, 8))]
    x = [a.astype("float32") for a in x]
    # A SavedModel revives a decoder block from its config, without the
    # cross-attention it creates on its first call (docs/guides/qat.md).
    cross_attention = fmt == "h5"
    x = x if cross_attention else x[0]
    _assert_trained_round_trip(
        _composite_model(cross_attention), x, tmp_path, fmt, epochs=1
    )


def test_import_on_another_backend_names_it():
    """On JAX, `kerasnorm.legacy`'s tf_keras layers would return JAX arrays
    (they compute with keras.ops): importing it raises, naming the backend;
    the Keras 3 layers still import."""
    # The JAX backend must be importable (the oldest-stack pass installs no
    # JAX).
    pytest.importorskip("jax")
    code = (
        "import kerasnorm\n"
        "try:\n"
        "    import kerasnorm.legacy\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(
        r"kerasnorm\.legacy needs Keras' TensorFlow backend.*'jax' backend.*"
        r"KERAS_BACKEND=tensorflow",
        result.stdout,
    ), result.stdout
