"""unwrap_weight_norm: the plain layer with the effective kernel, exactly."""

import keras
import numpy as np
import pytest

from kerasnorm.export import litert
from kerasnorm.export.fold.weight_norm import unwrap_weight_norm
from kerasnorm.layers import WeightNorm
from tests.support.helpers import random_inputs
from tests.support.helpers import trained_wrapper

# `kerasnorm.export` needs TensorFlow.
pytestmark = pytest.mark.tf_only

L = keras.layers

CASES = [
    ("dense", lambda: L.Dense(6, activation="relu"), (8, 5)),
    ("conv1d_causal", lambda: L.Conv1D(4, 3, padding="causal"), (4, 9, 3)),
    ("conv2d", lambda: L.Conv2D(5, 3, strides=2, padding="same"), (4, 8, 8, 3)),
    ("conv3d", lambda: L.Conv3D(2, 2, use_bias=False), (2, 4, 4, 4, 2)),
    ("conv2d_transpose", lambda: L.Conv2DTranspose(3, 3, strides=2), (4, 5, 5, 2)),
    ("depthwise2d", lambda: L.DepthwiseConv2D(3, depth_multiplier=2), (4, 7, 7, 3)),
    ("depthwise1d", lambda: L.DepthwiseConv1D(3), (4, 9, 3)),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("make", "shape"), [c[1:] for c in CASES], ids=IDS)
def test_unwrapped_layer_matches_the_wrapper(make, shape):
    x = random_inputs(shape, seed=1, scale=2.0, offset=0.5)
    wrapper = trained_wrapper(make, x)
    plain = unwrap_weight_norm(wrapper)
    assert type(plain) is type(wrapper.layer)
    assert plain.name == wrapper.name
    expected = np.asarray(wrapper(x))
    got = np.asarray(plain(x))
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * scale)
    config = {**wrapper.layer.get_config(), "name": wrapper.name}
    assert plain.get_config() == config
    assert len(plain.weights) == len(wrapper.layer.weights)


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        CASES[0][1:],
        CASES[2][1:],
        pytest.param(*CASES[4][1:], marks=pytest.mark.slow),
        pytest.param(*CASES[5][1:], marks=pytest.mark.slow),
    ],
    ids=["dense", "conv2d", "conv2d_transpose", "depthwise2d"],
)
def test_tflite_of_unwrapped_layer_has_only_the_plain_layer_ops(make, shape):
    x = random_inputs(shape, seed=2)
    wrapper = trained_wrapper(make, x)
    unwrapped = keras.Sequential([keras.Input(shape[1:]), unwrap_weight_norm(wrapper)])
    plain = keras.Sequential([keras.Input(shape[1:]), make()])
    content = litert.convert(unwrapped, batch_size=1)
    assert litert.op_counts(content) == litert.op_counts(
        litert.convert(plain, batch_size=1)
    )
    got = litert.run(content, x[:1])[0]
    np.testing.assert_allclose(got, np.asarray(wrapper(x[:1])), atol=1e-5)


def test_wrapper_is_left_untouched():
    x = random_inputs((3, 4))
    wrapper = trained_wrapper(lambda: L.Dense(2), x)
    before = [w.numpy() for w in wrapper.weights]
    unwrap_weight_norm(wrapper)
    for value, weight in zip(before, wrapper.weights, strict=True):
        np.testing.assert_array_equal(weight.numpy(), value)


def test_refuses_other_layers():
    with pytest.raises(ValueError, match=r"Received: wrapper=.*\(class Dense\)"):
        unwrap_weight_norm(L.Dense(2))


def test_refuses_an_unbuilt_wrapper():
    with pytest.raises(ValueError, match=r"needs a built `WeightNorm`.*built=False"):
        unwrap_weight_norm(WeightNorm(L.Dense(2), name="wn"))


def _wn_model(seed=0):
    """WeightNorm(Conv2D) -> BN -> ReLU -> WeightNorm(Dense) -> BN, trained-looking."""
    inputs = keras.Input((6, 6, 2), name="image")
    x = WeightNorm(L.Conv2D(4, 3), name="wn_conv")(inputs)
    x = L.BatchNormalization(name="bn_conv")(x)
    x = L.ReLU()(x)
    x = L.Flatten()(x)
    x = WeightNorm(L.Dense(5), name="wn_dense")(x)
    x = L.BatchNormalization(name="bn_dense")(x)
    model = keras.Model(inputs, x)
    x = random_inputs((8, 6, 6, 2), seed=seed)
    model(x, training=True)  # data-dependent init
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            n = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
            layer.beta.assign(rng.normal(size=n).astype("float32"))
            layer.moving_mean.assign(rng.normal(size=n).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n).astype("float32"))
    return model, x


def _plain_twin(model):
    """The same network with plain Conv2D/Dense and no BN: what folding should
    leave, for op-count comparisons."""
    inputs = keras.Input((6, 6, 2), name="image")
    x = L.Conv2D(4, 3)(inputs)
    x = L.ReLU()(x)
    x = L.Flatten()(x)
    return keras.Model(inputs, L.Dense(5)(x))


def test_fold_batchnorm_replaces_weight_norm_and_folds_bn_into_it():
    from kerasnorm.export import fold_batchnorm

    model, x = _wn_model()
    before = [w.numpy().copy() for w in model.weights]
    folded, report = fold_batchnorm(model, return_report=True)
    kinds = [type(layer).__name__ for layer in folded.layers]
    assert "WeightNorm" not in kinds and "BatchNormalization" not in kinds
    assert sorted(report.weight_norms) == ["wn_conv", "wn_dense"]
    assert {f.batchnorm for f in report.folded} == {"bn_conv", "bn_dense"}
    assert "WeightNorm removed: 2" in str(report)
    expected = np.asarray(model(x))
    got = np.asarray(folded(x))
    np.testing.assert_allclose(
        got, expected, rtol=0, atol=1e-5 * float(np.abs(expected).max())
    )
    for old, new in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(old, new.numpy())


def test_exports_of_a_weight_norm_model_have_only_the_plain_ops(tmp_path):
    import tensorflow as tf

    from kerasnorm.export import to_saved_model
    from kerasnorm.export import to_tflite

    model, _ = _wn_model(seed=1)
    plain = _plain_twin(model)
    to_tflite(model, tmp_path / "wn.tflite")
    to_tflite(plain, tmp_path / "plain.tflite")
    assert litert.op_counts((tmp_path / "wn.tflite").read_bytes()) == (
        litert.op_counts((tmp_path / "plain.tflite").read_bytes())
    )

    def graph_ops(path):
        """The op types of the serving function's body (the signature graph
        itself only calls it)."""
        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
        library = signature.graph.as_graph_def().library.function
        ops = sorted(node.op for function in library for node in function.node_def)
        assert "MatMul" in ops and "Conv2D" in ops
        return ops

    to_saved_model(model, tmp_path / "wn", version=1)
    to_saved_model(plain, tmp_path / "plain", version=1)
    assert graph_ops(tmp_path / "wn" / "1") == graph_ops(tmp_path / "plain" / "1")
