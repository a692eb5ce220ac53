"""kerasnorm.legacy.layers: tf_keras twins of the Keras 3 norm layers."""

import os
import subprocess
import sys

import numpy as np
import pytest

tf_keras = pytest.importorskip("tf_keras")

import kerasnorm  # noqa: E402
from kerasnorm.legacy import layers as legacy  # noqa: E402

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
    np.testing.assert_array_equal(twin(x).numpy(), np.asarray(k3(x)))


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
    model = _model()
    model.compile(tf_keras.optimizers.Adam(1e-2), "mse")
    model.fit(x, np.ones((16, 3), "float32"), epochs=2, verbose=0)
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
