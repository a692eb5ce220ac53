"""`to_tflite(..., smooth=...)`: norm-aware smoothing of int8 activations.

The references: the function of the model before smoothing, computed in
float64 numpy from its weights (smoothing must not change it), and the
plain int8 / "dynamic" file of the same model (smoothing must beat it on
a model whose norm outputs carry outlier channels)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import to_tflite
from kerasnorm.export.fold.smooth import _rescale
from kerasnorm.export.fold.smooth import smooth
from kerasnorm.export.fold.smooth import smoothing_sites
from tests.export import lm_models

pytestmark = pytest.mark.tf_only

L = keras.layers
CHANNELS, LENGTH = 32, 16
OUTLIERS = [1, 7, 20]


def _model(seed=0):
    """Dense -> BatchNorm (the fold's) -> RMSNorm read by two Dense, one
    through a ReLU -> LayerNorm -> Dense."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((LENGTH, CHANNELS), name="x")
    h = L.BatchNormalization(name="bn")(L.Dense(CHANNELS, name="inp")(x))
    n = kerasnorm.RMSNorm(name="rms")(h)
    a = L.Dense(CHANNELS, name="a")(n)
    b = L.Dense(CHANNELS, name="b")(L.ReLU(name="relu")(n))
    m = kerasnorm.LayerNorm(name="ln")(L.Add(name="add")([a, b]))
    model = keras.Model(x, L.Dense(8, name="head")(m), name="smoothable")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, (kerasnorm.RMSNorm, kerasnorm.LayerNorm)):
            layer.gamma.assign(rng.uniform(0.5, 1.5, CHANNELS))
        if isinstance(layer, kerasnorm.LayerNorm):
            layer.beta.assign(rng.normal(0, 0.1, CHANNELS))
    bn = model.get_layer("bn")
    bn.moving_mean.assign(rng.normal(0, 0.1, CHANNELS))
    bn.moving_variance.assign(rng.uniform(0.5, 2, CHANNELS))
    return model


def _with_outliers(model, gain=30.0):
    """Channels `OUTLIERS` of every smoothable norm's gain x `gain`, the
    readers' rows / `gain`: the same function, outliers in the norms'
    outputs (as trained LLMs have them)."""
    s = np.ones(CHANNELS)
    s[OUTLIERS] = 1.0 / gain
    for norm, readers in smoothing_sites(model):
        _rescale(norm, readers, s)
    return model


def _numpy_forward(model, x):
    """The model's function in float64, from its weights and the equations."""
    w = {
        layer.name: [np.asarray(v, "float64") for v in layer.get_weights()]
        for layer in model.layers
    }
    dense = lambda name, h: h @ w[name][0] + w[name][1]  # noqa: E731
    gamma, beta, mean, var = w["bn"]
    h = (dense("inp", x) - mean) / np.sqrt(var + 1e-3) * gamma + beta
    rms = model.get_layer("rms")
    n = h / np.sqrt(np.mean(h**2, -1, keepdims=True) + rms.epsilon) * w["rms"][0]
    s = dense("a", n) + dense("b", np.maximum(n, 0))
    ln = model.get_layer("ln")
    c = s - s.mean(-1, keepdims=True)
    m = c / np.sqrt(np.mean(c**2, -1, keepdims=True) + ln.epsilon)
    return dense("head", m * w["ln"][0] + w["ln"][1])


def _data(n=64, seed=1):
    return (
        np.random.default_rng(seed)
        .standard_normal((n, LENGTH, CHANNELS))
        .astype("float32")
    )


def test_sites_follow_the_affine_walk():
    model = _model()
    sites = {n.name: sorted(r.name for r in rs) for n, rs in smoothing_sites(model)}
    # The RMSNorm is read by two Dense (one through a ReLU: positive scales
    # commute with it); the LayerNorm by the head.
    assert sites == {"rms": ["a", "b"], "ln": ["head"]}


@pytest.mark.parametrize("strength", [None, 0.5])
def test_smoothing_changes_nothing_in_float64(strength):
    model = _with_outliers(_model())
    x = _data(8)
    before = _numpy_forward(model, x.astype("float64"))
    smoothed, restore = smooth(model, x, strength)
    assert {s.norm for s in smoothed} == {"rms", "ln"}
    assert all(s.spread_after < s.spread_before / 5 for s in smoothed)
    after = _numpy_forward(model, x.astype("float64"))
    # Computed in float64 from the weights, which are stored in float32:
    # each rescaled weight rounds once (2^-24), a few of those add up; a
    # reader left out would be off by the outlier gain (30x).
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6 * np.abs(before).max())
    gains = model.get_layer("rms").gamma.numpy().copy()
    restore()
    assert not np.array_equal(gains, model.get_layer("rms").gamma.numpy())
    np.testing.assert_allclose(_numpy_forward(model, x.astype("float64")), before)


@pytest.mark.parametrize("mode", ["int8", "dynamic"])
def test_smoothing_helps_on_outlier_channels(tmp_path, mode):
    model = _with_outliers(_model())
    weights = [v.copy() for v in model.get_weights()]
    data, held = _data(64), _data(64, seed=2)
    results = {
        smooth_: to_tflite(
            model,
            tmp_path / f"{smooth_}.tflite",
            quantize=mode,
            smooth=smooth_,
            representative_data=data,
            verify_inputs=held,
            tolerance=10.0,
        )
        for smooth_ in (None, True)
    }
    plain, smoothed = (results[k].verification.rms_rel_error for k in (None, True))
    assert smoothed < 0.5 * plain, (plain, smoothed)
    assert [s.norm for s in results[True].smoothed] == ["rms", "ln"]
    assert results[None].smoothed == ()
    # The user's model is put back exactly.
    for before, after in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)


def test_smoothing_a_keras_hub_gemma_keeps_its_function():
    pytest.importorskip("keras_hub")
    backbone = lm_models.backbone(
        "gemma", "decoder", vocabulary_size=64, num_layers=1, seed=0
    )
    rng = np.random.default_rng(0)
    data = {
        "token_ids": rng.integers(0, 64, (4, 12)).astype("int32"),
        "padding_mask": np.ones((4, 12), "int32"),
    }
    before = np.asarray(backbone(data), "float64")
    # Gemma's gain is 1 + scale: outliers there too.
    _with_outliers(backbone)
    smoothed, _ = smooth(backbone, data, None)
    assert [s.norm for s in smoothed] == ["pre_attention_norm", "pre_ffw_norm"]
    assert all(s.spread_after < 2.0 < 20.0 < s.spread_before for s in smoothed)
    after = np.asarray(backbone(data), "float64")
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantize": None}, r'pass quantize="int8" or "dynamic" with it'),
        ({"quantize": "float16"}, r"Received: quantize='float16'"),
        ({"quantize": "int16x8"}, r"Received: quantize='int16x8'"),
        ({"quantize": "dynamic", "representative_data": None}, "needs|calibrates"),
        ({"smooth": 1.5}, r"a migration strength in \[0, 1\]"),
        ({"smooth": "yes"}, r"Received: smooth='yes'"),
    ],
)
def test_smooth_is_refused_where_it_cannot_apply(tmp_path, kwargs, message):
    arguments = {
        "quantize": "int8",
        "smooth": True,
        "representative_data": _data(4),
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        to_tflite(_model(), tmp_path / "m.tflite", **arguments)


def test_smooth_without_a_norm_is_refused(tmp_path):
    x = keras.Input((CHANNELS,))
    model = keras.Model(x, L.Dense(4)(L.Dense(CHANNELS)(x)), name="plain")
    with pytest.raises(ValueError, match="smooth found no norm in model 'plain'"):
        to_tflite(
            model,
            tmp_path / "m.tflite",
            quantize="int8",
            smooth=True,
            representative_data=np.ones((4, CHANNELS), "float32"),
        )
