"""kerasnorm.export.quantize_aware and the Keras 3 -> tf_keras bridge."""

import importlib.util
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

tf_keras = pytest.importorskip("tf_keras")
# kerasnorm.legacy imports on Keras' TensorFlow backend only.
if keras.backend.backend() != "tensorflow":
    pytest.skip("kerasnorm.legacy needs TensorFlow", allow_module_level=True)
# Not imported here: importing TFMOT is what quantize_aware guards.
if importlib.util.find_spec("tensorflow_model_optimization") is None:
    pytest.skip(
        "tensorflow-model-optimization is not installed", allow_module_level=True
    )

import kerasnorm  # noqa: E402
from kerasnorm import export  # noqa: E402
from kerasnorm.export import litert  # noqa: E402
from kerasnorm.export.qat import bridge  # noqa: E402
from kerasnorm.export.qat.bridge import BRIDGED_LAYERS  # noqa: E402
from kerasnorm.legacy import layers as legacy  # noqa: E402
from tests.support.cases import CASE_NAMES  # noqa: E402
from tests.support.cases import case  # noqa: E402
from tests.support.cases import class_of  # noqa: E402
from tests.support.helpers import assert_twin_outputs  # noqa: E402

# TFMOT and tf_keras: TensorFlow.
pytestmark = pytest.mark.tf_only

L = keras.layers
RNG = np.random.default_rng(0)


def _random_weights(model, seed=0):
    """Non-trivial weights everywhere (BN statistics and norm gains too)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        weights = layer.get_weights()
        if isinstance(layer, L.BatchNormalization):
            weights[3] = rng.uniform(0.5, 2.0, weights[3].shape)
        layer.set_weights(
            [
                w
                if isinstance(layer, L.BatchNormalization) and i == 3
                else w + rng.normal(0.0, 0.3, w.shape)
                for i, w in enumerate(weights)
            ]
        )


# (name, input shape, layer factory): one model per supported layer.
BRIDGE_CASES = [
    ("Dense", (6,), lambda: L.Dense(4, activation="relu")),
    ("Conv1D", (7, 3), lambda: L.Conv1D(4, 3, padding="same")),
    ("Conv2D", (6, 6, 3), lambda: L.Conv2D(4, 3, strides=2)),
    ("DepthwiseConv2D", (6, 6, 3), lambda: L.DepthwiseConv2D(3, depth_multiplier=2)),
    ("BatchNormalization", (6, 6, 3), lambda: L.BatchNormalization()),
    ("Activation", (6,), lambda: L.Activation("sigmoid")),
    ("ReLU", (6,), lambda: L.ReLU(max_value=1.0)),
    ("MaxPooling1D", (8, 3), lambda: L.MaxPooling1D()),
    ("MaxPooling2D", (6, 6, 3), lambda: L.MaxPooling2D()),
    ("AveragePooling1D", (8, 3), lambda: L.AveragePooling1D(2)),
    ("AveragePooling2D", (6, 6, 3), lambda: L.AveragePooling2D(2)),
    ("GlobalAveragePooling1D", (8, 3), lambda: L.GlobalAveragePooling1D()),
    ("GlobalAveragePooling2D", (6, 6, 3), lambda: L.GlobalAveragePooling2D()),
    ("GlobalMaxPooling1D", (8, 3), lambda: L.GlobalMaxPooling1D()),
    ("GlobalMaxPooling2D", (6, 6, 3), lambda: L.GlobalMaxPooling2D()),
    ("Flatten", (6, 6, 3), lambda: L.Flatten()),
    ("Reshape", (6, 6, 3), lambda: L.Reshape((36, 3))),
    ("Dropout", (6,), lambda: L.Dropout(0.5)),
]


def test_bridge_cases_cover_every_supported_layer():
    names = {name for name, _, _ in BRIDGE_CASES} | set(bridge._MERGE_LAYERS)
    assert set(BRIDGED_LAYERS) <= names


@pytest.mark.parametrize(
    ("name", "shape", "factory"), BRIDGE_CASES, ids=[c[0] for c in BRIDGE_CASES]
)
def test_bridge_round_trips_outputs(name, shape, factory):
    inputs = keras.Input(shape, name="x")
    layer = factory()
    model = keras.Model(inputs, layer(inputs))
    _random_weights(model)
    rebuilt = export.to_tf_keras(model)
    assert isinstance(rebuilt, tf_keras.Model)
    (twin,) = [t for t in rebuilt.layers if type(t).__name__ == name]
    assert twin.get_config()["name"] == layer.name
    x = RNG.normal(size=(4, *shape)).astype("float32")
    assert_twin_outputs(rebuilt(x).numpy(), np.asarray(model(x)))
    for got, want in zip(twin.get_weights(), layer.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def _bridge_round_trip(shapes, build, seed=0):
    inputs = [keras.Input(shape) for shape in shapes]
    model = keras.Model(inputs, build(*inputs))
    _random_weights(model, seed)
    rng = np.random.default_rng(seed)
    x = [rng.normal(size=(3, *shape)).astype("float32") for shape in shapes]
    x = x if len(x) > 1 else x[0]
    rebuilt = export.to_tf_keras(model, verify_inputs=x)
    assert isinstance(rebuilt, tf_keras.Model)
    got = [np.asarray(y) for y in keras.tree.flatten(rebuilt(x))]
    expected = [np.asarray(y) for y in keras.tree.flatten(model(x))]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_twin_outputs(g, e)
    for layer in model.layers:
        if isinstance(layer, L.InputLayer):
            continue
        twin = rebuilt.get_layer(layer.name)
        for g, w in zip(twin.get_weights(), layer.get_weights(), strict=True):
            np.testing.assert_array_equal(g, w)
    return model, rebuilt


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bridge_round_trips_every_public_kerasnorm_class(name):
    this, cls_name = case(name), class_of(name)
    if this.bridge_refused:
        pytest.skip(f"kerasnorm.{name} is refused by the bridge: {this.bridge_refused}")
    layer = this.make(getattr(kerasnorm.layers, cls_name), keras)
    _, rebuilt = _bridge_round_trip(this.shapes, layer)
    twins = [*rebuilt.layers, *(t.cell for t in rebuilt.layers if hasattr(t, "cell"))]
    assert cls_name in {type(t).__name__ for t in twins}


def test_bridge_passes_tensors_given_by_keyword():
    def build(x, source, state):
        x = kerasnorm.TransformerDecoderBlock(2, 4, 8)(x, encoder_sequence=source)
        return kerasnorm.LayerNormGRU(3)(x, initial_state=[state])

    _bridge_round_trip([(5, 8), (4, 6), (3,)], build)


def test_bridge_keeps_graph_merges_shared_layers_and_several_outputs():
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    shared = L.Dense(6, name="shared")
    s = L.Add()([shared(a), shared(b)])
    c = L.Concatenate()([s, a])
    model = keras.Model([a, b], [L.Dense(2)(c), kerasnorm.LayerNorm()(s)])
    _random_weights(model)
    rebuilt = export.to_tf_keras(model)
    x = [RNG.normal(size=(3, 6)).astype("float32") for _ in range(2)]
    for got, want in zip(rebuilt(x), model(x), strict=True):
        assert_twin_outputs(got.numpy(), want)
    assert len(rebuilt.get_layer("shared").weights) == 2


def test_bridge_refuses_unsupported_layers():
    inputs = keras.Input((5, 3))
    model = keras.Model(inputs, L.LSTM(4, name="my_lstm")(inputs))
    with pytest.raises(ValueError, match=r"'my_lstm' \(keras.*LSTM\) has no tf_keras"):
        export.to_tf_keras(model)
    with pytest.raises(ValueError, match=r"'my_lstm'"):
        export.quantize_aware(model)
    model = keras.Model(inputs, L.RNN(L.LSTMCell(4), name="plain_rnn")(inputs))
    with pytest.raises(ValueError, match=r"'plain_rnn' .* runs a LSTMCell cell"):
        export.to_tf_keras(model)
    model = keras.Model(inputs, keras.ops.abs(inputs))
    with pytest.raises(ValueError, match=r"Absolute"):
        export.to_tf_keras(model)
    lora = L.Dense(4, name="lora_dense")
    model = keras.Model(inputs, lora(inputs))
    lora.enable_lora(2)
    with pytest.raises(ValueError, match=r"'lora_dense' \(Dense\) uses lora_rank=2"):
        export.to_tf_keras(model)


def test_bridge_refuses_subclassed_models():
    class Sub(keras.Model):
        def call(self, x):
            return x * 2

    model = Sub()
    model(np.zeros((1, 3), "float32"))
    with pytest.raises(ValueError, match=r"Only Functional and Sequential"):
        export.to_tf_keras(model)


def test_bridge_parity_failure_is_reported(monkeypatch):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, kerasnorm.LayerNorm(epsilon=1e-5)(inputs))
    original = bridge._twin

    def wrong_epsilon(layer):
        twin = original(layer)
        twin.epsilon = 1.0
        return twin

    monkeypatch.setattr(bridge, "_twin", wrong_epsilon)
    with pytest.raises(export.ExportVerificationError, match=r"tolerance=1e-05"):
        export.to_tf_keras(
            model, verify_inputs=np.ones((2, 4), "float32") * [1, 2, 3, 4]
        )


def test_missing_tfmot_names_the_qat_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_model_optimization", None)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, L.Dense(2)(inputs))
    with pytest.raises(ImportError, match=r"kerasnorm\[qat\]"):
        export.quantize_aware(model)


def _legacy_cnn():
    inputs = tf_keras.Input((6, 6, 2))
    x = tf_keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = tf_keras.layers.BatchNormalization()(x)
    x = tf_keras.layers.ReLU()(x)
    x = legacy.GroupNorm(groups=2, name="group_norm")(x)
    x = tf_keras.layers.Flatten()(x)
    x = legacy.LayerNorm(name="layer_norm")(tf_keras.layers.Dense(16)(x))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(3)(x))


def _levels(model, layer_name, x):
    probe = tf_keras.Model(model.input, model.get_layer(layer_name).output)
    return np.unique(probe(x).numpy())


@pytest.mark.slow
@pytest.mark.exhaustive  # on demand: CI's slow tier runs QAT on digits
def test_quantize_configs_quantize_or_keep_float(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 6, 6, 2)).astype("float32")
    tf_keras.utils.set_random_seed(0)
    quantized = export.quantize_aware(_legacy_cnn())
    tf_keras.utils.set_random_seed(0)
    kept = export.quantize_aware(_legacy_cnn(), keep_float=["layer_norm"])
    for qat in (quantized, kept):
        qat.compile(tf_keras.optimizers.Adam(1e-3), "mse")
        qat.fit(x, np.ones((64, 3), "float32"), epochs=1, verbose=0)
    # Quantized: the output takes at most 256 equally spaced values.
    levels = _levels(quantized, "quant_layer_norm", x)
    assert len(levels) <= 256
    steps = np.diff(levels)
    np.testing.assert_allclose(
        steps / steps.min(), np.round(steps / steps.min()), atol=1e-3
    )
    # Kept float: (64 x 16) distinct values, not a grid.
    assert len(_levels(kept, "quant_layer_norm", x)) > 256
    assert len(_levels(kept, "quant_group_norm", x)) <= 256
    # Both convert to builtin int8 ops and match their QAT model: the kept
    # layer is quantized by the converter from calibration instead.
    for name, qat in (("quantized", quantized), ("kept", kept)):
        result = export.to_tflite(
            qat, tmp_path / f"{name}.tflite", quantize="int8", representative_data=x
        )
        with open(result.path, "rb") as f:
            ops = litert.op_names(f.read())
        assert not [op for op in ops if op.startswith("Flex")]
        assert export.verify(qat, result.path, x, quantize="int8").passed


def test_keep_float_names_must_be_norm_layers():
    with pytest.raises(ValueError, match=r"keep_float=\['dense'\]"):
        export.quantize_aware(_legacy_cnn(), keep_float=["dense"])


KERAS3_AFTER_QAT = """
import os, sys
import keras, numpy as np, tensorflow as tf
import kerasnorm
from kerasnorm.export import quantize_aware
inputs = keras.Input((4,))
quantize_aware(keras.Model(inputs, kerasnorm.LayerNorm()(inputs)))
assert "tensorflow_model_optimization" in sys.modules
assert os.environ.get("TF_USE_LEGACY_KERAS") is None, "TF_USE_LEGACY_KERAS left set"
model = keras.Sequential(
    [keras.Input((4,)), keras.layers.Dense(8), kerasnorm.GroupNorm(groups=2),
     keras.layers.Dense(1)]
)
model.compile("adam", "mse")
loss = model.fit(np.ones((8, 4)), np.zeros((8, 1)), epochs=3, verbose=0).history["loss"]
assert loss[-1] < loss[0], loss
model.save(sys.argv[1])
loaded = keras.saving.load_model(sys.argv[1], safe_mode=True)
assert isinstance(loaded.layers[1], kerasnorm.GroupNorm)
np.testing.assert_array_equal(loaded(np.ones((2, 4))), model(np.ones((2, 4))))
"""


@pytest.mark.slow
def test_keras3_still_builds_trains_and_saves_after_qat(tmp_path):
    # A fresh process: TFMOT sets TF_USE_LEGACY_KERAS on its first import only.
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run(
        [sys.executable, "-c", KERAS3_AFTER_QAT, str(tmp_path / "m.keras")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def digits_cnn():
    inputs = keras.Input((8, 8, 1))
    x = inputs
    for width in (16, 32):
        x = L.Conv2D(width, 3, padding="same", use_bias=False)(x)
        x = L.ReLU()(L.BatchNormalization()(x))
    x = kerasnorm.GroupNorm(groups=8)(x)
    x = L.Flatten()(L.MaxPooling2D()(x))
    x = L.ReLU()(kerasnorm.LayerNorm()(L.Dense(64)(x)))
    return keras.Model(inputs, L.Dense(10)(x))


@pytest.mark.slow
def test_qat_int8_accuracy_on_digits(tmp_path):
    from kerasnorm.cli.demo import load_digits

    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load_digits(0)
    model = digits_cnn()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_train, y_train, batch_size=32, epochs=10, verbose=0)
    float_acc = np.mean(np.asarray(model(x_test)).argmax(-1) == y_test)

    def tflite_acc(result):
        with open(result.path, "rb") as f:
            (logits,) = litert.Runner(f.read()).predict(x_test)
        return np.mean(logits.argmax(-1) == y_test)

    ptq = export.to_tflite(
        model, tmp_path / "ptq.tflite", quantize="int8", representative_data=x_train
    )
    qat = export.quantize_aware(model, verify_inputs=x_test)
    tf_keras.utils.set_random_seed(0)
    qat.compile(
        tf_keras.optimizers.Adam(1e-4),
        tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    qat.fit(x_train, y_train, batch_size=32, epochs=2, verbose=0)
    qat_int8 = export.to_tflite(
        qat, tmp_path / "qat.tflite", quantize="int8", representative_data=x_train
    )
    qat_acc, ptq_acc = tflite_acc(qat_int8), tflite_acc(ptq)
    assert float_acc > 0.95
    assert qat_acc >= float_acc - 0.01, (float_acc, ptq_acc, qat_acc)
    assert qat_acc >= ptq_acc, (float_acc, ptq_acc, qat_acc)


def _conv_ln_gru(unroll):
    inputs = keras.Input((8, 6, 1))
    x = L.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = L.Reshape((8, 48))(L.ReLU()(L.BatchNormalization()(x)))
    x = kerasnorm.LayerNormGRU(16, unroll=unroll, name="ln_gru")(x)
    return keras.Model(inputs, L.Dense(3)(x))


def test_quantize_aware_refuses_a_rolled_time_loop():
    with pytest.raises(ValueError, match=r"'ln_gru' .*unroll=True.*unroll=False"):
        export.quantize_aware(_conv_ln_gru(unroll=False))


@pytest.mark.slow
@pytest.mark.exhaustive  # on demand: CI's slow tier runs QAT on digits
def test_ln_gru_model_goes_through_qat_to_builtin_int8(tmp_path):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8, 6, 1)).astype("float32")
    y = rng.normal(size=(64, 3)).astype("float32")
    model = _conv_ln_gru(unroll=True)
    model.compile("adam", "mse")
    model.fit(x, y, epochs=2, verbose=0)
    qat = export.quantize_aware(model, verify_inputs=x[:8])
    (gru,) = [w for w in qat.layers if w.name == "quant_ln_gru"]
    assert isinstance(gru.layer, legacy.LayerNormGRU)
    assert type(gru.quantize_config).__name__ == "FloatQuantizeConfig"
    qat.compile(tf_keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, y, epochs=1, verbose=0)
    result = export.to_tflite(
        qat, tmp_path / "gru.tflite", quantize="int8", representative_data=x
    )
    with open(result.path, "rb") as f:
        ops = litert.op_names(f.read())
    assert "FULLY_CONNECTED" in ops and "CONV_2D" in ops
    assert not [op for op in ops if op.startswith("Flex") or op == "WHILE"]
    assert export.verify(qat, result.path, x, quantize="int8").passed
