"""BatchNorm folding (SPEC.md §4): every foldable pattern, the never-fold cases."""

import keras
import numpy as np
import pytest

from kerasnorm.export import FoldReport
from kerasnorm.export import fold_batchnorm
from tests.helpers import random_inputs

L = keras.layers


def _randomize(model, seed=3):
    """Non-trivial weights and BN statistics (gamma, beta, mean, var)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        value = np.asarray(w.numpy())
        if w.name == "moving_variance":
            value = rng.uniform(0.3, 2.0, value.shape)
        elif w.name == "gamma":
            value = rng.uniform(0.5, 1.5, value.shape) * rng.choice(
                [-1, 1], value.shape
            )
        else:
            value = value + 0.3 * rng.standard_normal(value.shape)
        w.assign(value.astype(w.dtype))
    return model


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)


def _bns(model):
    return [x for x in _all_layers(model) if isinstance(x, L.BatchNormalization)]


def _outputs(model, data):
    return [np.asarray(o) for o in keras.tree.flatten(model(data, training=False))]


def _check_same_function(model, folded, data, rtol=1e-5):
    for got, want in zip(_outputs(folded, data), _outputs(model, data), strict=True):
        scale = max(np.abs(want).max(), 1e-6)
        assert np.abs(got - want).max() <= rtol * scale, np.abs(got - want).max()


def _fold_and_check(model, data, *, expect_left=0):
    _randomize(model)
    before = [np.array(w.numpy()) for w in model.weights]
    want = _outputs(model, data)
    folded, report = fold_batchnorm(model, return_report=True)
    assert isinstance(report, FoldReport)
    assert len(_bns(folded)) == expect_left, report
    assert len(report.kept) == expect_left, report
    assert len(report.folded) == len(_bns(model)) - expect_left, report
    _check_same_function(model, folded, data)
    # The original model is untouched: same weights, same outputs.
    for w, value in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(np.asarray(w.numpy()), value)
    for got, ref in zip(_outputs(model, data), want, strict=True):
        np.testing.assert_array_equal(got, ref)
    return folded, report


def _seq(shape, *layers):
    return keras.Sequential([keras.Input(shape), *layers])


FOLDABLE = {
    "conv2d_bias": lambda: _seq(
        (6, 6, 3), L.Conv2D(4, 3, padding="same"), L.BatchNormalization()
    ),
    "conv2d_no_bias": lambda: _seq(
        (6, 6, 3), L.Conv2D(4, 3, use_bias=False), L.BatchNormalization(), L.ReLU()
    ),
    "bn_scale_false": lambda: _seq(
        (6, 6, 3), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(scale=False)
    ),
    "bn_center_false": lambda: _seq(
        (6, 6, 3), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(center=False)
    ),
    "depthwise_multiplier_2": lambda: _seq(
        (6, 6, 3),
        L.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
        L.BatchNormalization(),
    ),
    "depthwise1d": lambda: _seq(
        (9, 3), L.DepthwiseConv1D(3, depth_multiplier=2), L.BatchNormalization()
    ),
    "conv2d_transpose_stride_2": lambda: _seq(
        (5, 5, 3),
        L.Conv2DTranspose(4, 3, strides=2, padding="same", use_bias=False),
        L.BatchNormalization(),
    ),
    "conv1d_transpose": lambda: _seq(
        (7, 3), L.Conv1DTranspose(4, 3, strides=2), L.BatchNormalization()
    ),
    "conv1d": lambda: _seq(
        (9, 3), L.Conv1D(5, 3, padding="causal"), L.BatchNormalization()
    ),
    "conv3d": lambda: _seq((4, 4, 4, 2), L.Conv3D(3, 2), L.BatchNormalization()),
    "grouped_conv": lambda: _seq(
        (6, 6, 4), L.Conv2D(6, 3, groups=2), L.BatchNormalization()
    ),
    "separable_pointwise": lambda: _seq(
        (6, 6, 3),
        L.SeparableConv2D(5, 3, depth_multiplier=2, padding="same"),
        L.BatchNormalization(),
    ),
    "dense": lambda: _seq((7,), L.Dense(5), L.BatchNormalization()),
    "dense_rank3": lambda: _seq(
        (4, 7), L.Dense(5, use_bias=False), L.BatchNormalization()
    ),
    "bn_before_dense": lambda: _seq((7,), L.BatchNormalization(), L.Dense(5)),
    "bn_before_dense_no_bias": lambda: _seq(
        (7,), L.BatchNormalization(), L.Dense(5, use_bias=False, activation="relu")
    ),
    "bn_before_valid_conv": lambda: _seq(
        (7, 7, 3), L.BatchNormalization(), L.Conv2D(4, 3, strides=2)
    ),
    "bn_before_valid_grouped_conv": lambda: _seq(
        (7, 7, 4), L.BatchNormalization(), L.Conv2D(6, 3, groups=2, use_bias=False)
    ),
    "bn_before_valid_depthwise": lambda: _seq(
        (7, 7, 3), L.BatchNormalization(), L.DepthwiseConv2D(3, depth_multiplier=2)
    ),
    "bn_before_valid_separable": lambda: _seq(
        (7, 7, 3), L.BatchNormalization(), L.SeparableConv2D(4, 3, depth_multiplier=2)
    ),
    "bn_before_valid_conv1d": lambda: _seq(
        (9, 3), L.BatchNormalization(), L.Conv1D(4, 3)
    ),
    "chain": lambda: _seq(
        (8, 8, 3),
        L.Conv2D(4, 3, padding="same", use_bias=False),
        L.BatchNormalization(),
        L.ReLU(),
        L.Conv2D(4, 3, padding="same"),
        L.BatchNormalization(),
        L.ReLU(),
        L.Flatten(),
        L.BatchNormalization(),
        L.Dense(6),
        L.BatchNormalization(),
    ),
    "bn_bn_dense": lambda: _seq(
        (7,), L.BatchNormalization(), L.BatchNormalization(), L.Dense(3)
    ),
    "conv_bn_bn": lambda: _seq(
        (6, 6, 2), L.Conv2D(3, 3), L.BatchNormalization(), L.BatchNormalization()
    ),
    "channels_first": lambda: _seq(
        (3, 6, 6),
        L.Conv2D(4, 3, padding="same", data_format="channels_first"),
        L.BatchNormalization(axis=1),
        L.ReLU(),
        L.BatchNormalization(axis=1),
        L.Conv2D(2, 3, data_format="channels_first"),
    ),
    "channels_first_depthwise": lambda: _seq(
        (3, 6, 6),
        L.DepthwiseConv2D(3, depth_multiplier=2, data_format="channels_first"),
        L.BatchNormalization(axis=1),
    ),
}


@pytest.mark.parametrize("name", sorted(FOLDABLE))
def test_fold_pattern(name):
    model = FOLDABLE[name]()
    data = random_inputs((4, *model.inputs[0].shape[1:]), seed=5)
    folded, _ = _fold_and_check(model, data)
    assert isinstance(folded, keras.Sequential)


def test_nested_and_multi_input_output():
    inner = _seq(
        (6, 6, 3), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(), L.ReLU()
    )
    inner_functional_in = keras.Input((5,))
    inner_functional = keras.Model(
        inner_functional_in,
        L.BatchNormalization()(L.Dense(4)(inner_functional_in)),
        name="inner_functional",
    )
    a = keras.Input((6, 6, 3), name="image")
    b = keras.Input((5,), name="features")
    x = L.GlobalAveragePooling2D()(inner(a))
    y = inner_functional(b)
    z = L.BatchNormalization()(L.Dense(4)(L.Concatenate()([x, y])))
    model = keras.Model([a, b], {"logits": z, "embedding": y})
    data = random_inputs([(3, 6, 6, 3), (3, 5)], seed=2)
    folded, report = _fold_and_check(model, data)
    names = {f.batchnorm for f in report.folded}
    assert any(n.startswith(inner.name + "/") for n in names), report
    assert any(n.startswith("inner_functional/") for n in names), report
    assert [t.name for t in folded.inputs] == ["image", "features"]
    assert set(folded.output) == {"logits", "embedding"}


def _never(model, data, reason):
    folded, report = _fold_and_check(model, data, expect_left=1)
    assert reason in report.kept[0].reason, report
    assert reason in str(report)
    return folded


def test_never_fold_activation_in_between():
    model = _seq((6, 6, 3), L.Conv2D(4, 3, activation="relu"), L.BatchNormalization())
    _never(model, random_inputs((2, 6, 6, 3)), "activation 'relu' in between")
    model = _seq((6, 6, 3), L.Conv2D(4, 3), L.ReLU(), L.BatchNormalization(), L.ReLU())
    _never(model, random_inputs((2, 6, 6, 3)), "activation in between")


def test_never_fold_several_consumers():
    inputs = keras.Input((6,))
    h = L.Dense(4)(inputs)
    model = keras.Model(inputs, [L.BatchNormalization()(h), L.ReLU()(h)])
    _never(model, random_inputs((2, 6)), "several consumers")


def test_never_fold_axis_not_channel_axis():
    model = _seq((5, 6), L.Dense(4), L.BatchNormalization(axis=1))
    _never(model, random_inputs((2, 5, 6)), "not the channel axis")


def test_never_fold_same_padding_with_shift():
    model = _seq(
        (6, 6, 3), L.ReLU(), L.BatchNormalization(), L.Conv2D(4, 3, padding="same")
    )
    _never(model, random_inputs((2, 6, 6, 3)), "padding='same'")


def test_same_padding_folds_when_shift_is_zero():
    model = _seq(
        (6, 6, 3),
        L.ReLU(),
        L.BatchNormalization(center=False),
        L.Conv2D(4, 3, padding="same"),
    )
    _randomize(model)
    model.layers[1].moving_mean.assign(np.zeros(3, "float32"))
    folded, report = fold_batchnorm(model, return_report=True)
    assert not _bns(folded) and report.folded[0].position == "before"
    _check_same_function(model, folded, random_inputs((2, 6, 6, 3)))


def test_never_fold_shared_layers():
    dense = L.Dense(4)
    a, b = keras.Input((4,)), keras.Input((4,))
    model = keras.Model([a, b], L.BatchNormalization()(dense(dense(a) + b)))
    _never(model, random_inputs([(2, 4), (2, 4)]), "shared")
    bn = L.BatchNormalization()
    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(4)(bn(L.Dense(4)(bn(x)))))
    _randomize(model)
    folded, report = fold_batchnorm(model, return_report=True)
    assert len(_bns(folded)) == 1 and not report.folded
    assert len(report.kept) == 2 and "shared" in report.kept[0].reason
    _check_same_function(model, folded, random_inputs((2, 4)))


def test_never_fold_training_mode():
    inputs = keras.Input((5,))
    model = keras.Model(
        inputs, L.BatchNormalization()(L.Dense(4)(inputs), training=True)
    )
    _randomize(model)
    folded, report = fold_batchnorm(model, return_report=True)
    assert len(_bns(folded)) == 1 and "training=True" in report.kept[0].reason


def test_never_fold_transposed_conv_with_shift():
    model = _seq(
        (5, 5, 3), L.ReLU(), L.BatchNormalization(), L.Conv2DTranspose(4, 3, strides=2)
    )
    _never(model, random_inputs((2, 5, 5, 3)), "transposed convolution")


def _numpy_fold_conv2d_after(kernel, bias, gamma, beta, mean, var, eps):
    """SPEC.md §4 written out independently: W' = W * s, b' = (b - mean) * s + beta."""
    s = gamma / np.sqrt(var + eps)
    w = np.empty_like(kernel)
    for o in range(kernel.shape[-1]):
        w[:, :, :, o] = kernel[:, :, :, o] * s[o]
    return w, (bias - mean) * s + beta


def _numpy_fold_conv2d_before(kernel, bias, gamma, beta, mean, var, eps):
    """W' = W * s along the input channels, b' = b + sum_{kh, kw, c} W * t."""
    s = gamma / np.sqrt(var + eps)
    t = beta - mean * s
    w = np.empty_like(kernel)
    b = bias.copy()
    for c in range(kernel.shape[2]):
        w[:, :, c, :] = kernel[:, :, c, :] * s[c]
        b = b + kernel[:, :, c, :].sum(axis=(0, 1)) * t[c]
    return w, b


@pytest.mark.parametrize("position", ["after", "before"])
def test_folded_conv2d_weights_match_numpy(position):
    conv = L.Conv2D(4, 3, name="conv")
    bn = L.BatchNormalization(epsilon=1e-3, name="bn")
    pair = [conv, bn] if position == "after" else [bn, conv]
    model = _randomize(_seq((7, 7, 3), *pair))
    folded = fold_batchnorm(model)
    weights = [np.asarray(w.numpy(), "float64") for w in (conv.kernel, conv.bias)]
    stats = [
        np.asarray(v.numpy(), "float64")
        for v in (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance)
    ]
    fold = (
        _numpy_fold_conv2d_after if position == "after" else _numpy_fold_conv2d_before
    )
    want_w, want_b = fold(*weights, *stats, 1e-3)
    new = folded.get_layer("conv")
    np.testing.assert_allclose(
        np.asarray(new.kernel.numpy()), want_w, rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(
        np.asarray(new.bias.numpy()), want_b, rtol=1e-6, atol=1e-6
    )


def test_errors():
    with pytest.raises(ValueError, match="not built"):
        fold_batchnorm(keras.Sequential([L.Dense(2), L.BatchNormalization()]))
    with pytest.raises(ValueError, match=r"Expected a keras\.Model. Received: model="):
        fold_batchnorm(L.Dense(2))

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = L.Dense(2)

        def call(self, x):
            return self.dense(x)

    sub = Sub()
    sub(np.zeros((1, 3), "float32"))
    with pytest.raises(ValueError, match=r"Functional or Sequential.*fold=False"):
        fold_batchnorm(sub)


def test_returns_model_only_by_default():
    model = _seq((4,), L.Dense(3), L.BatchNormalization())
    assert isinstance(fold_batchnorm(model), keras.Model)
