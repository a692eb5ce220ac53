"""export/ondevice_pairs.py: the side-by-side rows, a row with a Keras-layer
twin for Keras' export, and the Markdown of part 1 (export/tables.py)."""

import types

import keras
import numpy as np
import pytest

import kerasnorm
from export import models
from export import ondevice_pairs
from export import tables


def test_quick_pairs_are_the_quick_rows_and_the_trained_digits_models():
    trained = {
        "LayerNormLSTM(8), digits rows (8x8)": ("m1", "xa", "xb"),
        "LayerNormGRU(8), running sum (8x2)": ("m2", "xc", "xd"),
    }
    quick = ondevice_pairs.pairs(True, trained)
    assert [p.name for p in quick] == [
        "conv + GroupNorm",
        "LayerNormLSTM(8), digits rows (8x8)",
    ]
    assert quick[1].build() == "m1" and quick[1].data == ("xa", "xb")
    full = [p.name for p in ondevice_pairs.pairs(False, trained)]
    assert full[:4] == [
        "conv + GroupNorm",
        "conv + LayerNorm",
        "MobileNetV3Small 96x96",
        "DeepNorm encoder",
    ]
    assert full[4:9] == [
        "conv + LayerNorm vs Keras LayerNormalization",
        "conv + RMSNorm vs Keras RMSNormalization",
        "conv + GroupNorm vs Keras GroupNormalization",
        "token MLP + LayerNorm vs Keras LayerNormalization",
        "token MLP + RMSNorm vs Keras RMSNormalization",
    ]
    assert full[9:] == ["LayerNormLSTM(8), digits rows (8x8)"]


def test_the_wide_twins_are_each_norm_at_the_wider_size():
    pairs = ondevice_pairs.wide_twin_pairs()
    assert [p.name.split(" vs ")[0] for p in pairs] == [
        "wide conv + LayerNorm",
        "wide conv + RMSNorm",
        "wide conv + GroupNorm",
        "4-block token MLP 64x128 + LayerNorm",
        "4-block token MLP 64x128 + RMSNorm",
    ]
    assert pairs[0].data(2).shape == (2, 32, 32, 16)
    assert pairs[3].data(2).shape == (2, 64, 128)


@pytest.mark.parametrize(
    "pair",
    [*ondevice_pairs.pairs(False, {})[4:9], *ondevice_pairs.wide_twin_pairs()],
    ids=lambda pair: pair.name.split(" vs ")[0],
)
def test_a_keras_layer_twin_computes_the_kerasnorm_model(pair):
    """The float32 rows compare two exporters at equal error only if the
    twin, given the kerasnorm model's weights as `side_by_side` gives them,
    computes the same function; and the norms' weights are not the ones
    and zeros a converter would fold away."""
    keras.utils.set_random_seed(0)
    model = pair.build()
    twin = pair.keras_build()
    twin.set_weights(model.get_weights())
    norms = [w for w in model.weights if w.path.endswith(("gamma", "beta"))]
    assert norms and all(np.ptp(np.asarray(w)) > 0 for w in norms)
    x = pair.data(4)
    np.testing.assert_allclose(
        np.asarray(twin(x)), np.asarray(model(x)), rtol=1e-4, atol=1e-5
    )


def _cell(ms, flex=(), **extra):
    return {"ops": 10, "size_kib": 1.5, "ms": ms, "flex": list(flex), **extra}


def test_side_by_side_table_labels_the_twin_and_lists_failures():
    row = {
        "model": "m",
        "keras model": "Keras layers",
        "kerasnorm float32": _cell(1.0, max_rel=1e-7, op_counts={"ADD": 1}),
        "kerasnorm int8": _cell(0.5, rms_rel=0.01, op_counts={"ADD": 1}),
        "keras float32": _cell(2.0, ["FlexX"], max_rel=2e-7, op_counts={"MUL": 2}),
        "keras int8": {"error": "ValueError: no"},
    }
    text = tables.side_by_side_table([row])
    assert "| m | kerasnorm | yes | 10 | 1.5 | 1.000 | 1.0e-07 | yes | 0.500 |" in text
    assert "| 0.010 | 0.50 |" in text
    assert "| m | keras (Keras layers) | no: FlexX |" in text
    assert "export failed" in text
    assert "- m, keras int8: ValueError: no" in text
    assert (
        "- m, float32 ops differing (kerasnorm vs keras): ADD 1 vs 0, MUL 0 vs 2"
        in text
    )


def test_modes_table_has_a_line_per_mode_and_the_verdict():
    from kerasnorm.export import QUANTIZE_MODES

    row = {"model": "r", "float": {"accuracy": 0.9}}
    for mode in QUANTIZE_MODES:
        row[mode or "float32"] = {
            "unrolled": "no",
            "accuracy": 0.9 if mode != "int8" else 0.885,
            "rms_rel": 0.01,
            "size_kib": 2.0,
            "ops": 3,
            "convert_s": 1.0,
            "ms": 0.1,
        }
    row["float16"] = {"error": "ValueError: broken"}
    text = tables.modes_table([row])
    for mode in QUANTIZE_MODES:
        assert f"| r | {mode or 'float32'} |" in text
    assert "| r | float16 | - | - | - | - | - | - | - |" in text
    assert "- r, float16: ValueError: broken" in text
    best = max(
        (row[m]["accuracy"], m) for m in ("int8", "int16x8") if m in QUANTIZE_MODES
    )
    delta = 100 * (best[0] - 0.9)
    assert f"best integer mode {best[1]} {delta:+.2f} points" in text


@pytest.mark.slow
@pytest.mark.tf_only
def test_a_pair_with_a_keras_layer_twin(tmp_path):
    """The row the `speed` comparison adds: kerasnorm's LayerNorm model
    through to_tflite against the same net with Keras' LayerNormalization
    through Keras' export; the twin holds the first model's weights."""
    built = {}
    side = 8

    def build():
        built["kerasnorm"] = models.conv_net(kerasnorm.LayerNorm, side, (4, 8))
        return built["kerasnorm"]

    def keras_build():
        epsilon = kerasnorm.LayerNorm().epsilon
        built["keras"] = models.conv_net(
            lambda: keras.layers.LayerNormalization(epsilon=epsilon), side, (4, 8)
        )
        return built["keras"]

    rng = np.random.default_rng(0)
    pair = ondevice_pairs.Pair(
        "conv + LayerNorm vs Keras LayerNormalization",
        build,
        lambda n: rng.uniform(-1, 1, (n, side, side, 3)).astype("float32"),
        keras_build=keras_build,
    )
    args = types.SimpleNamespace(calibration=8, check=8, repeats=1)
    row = ondevice_pairs.side_by_side(pair, args, str(tmp_path))
    assert row["keras model"] == "Keras layers"
    x = rng.uniform(-1, 1, (4, side, side, 3)).astype("float32")
    want = built["kerasnorm"].predict(x, verbose=0)
    np.testing.assert_allclose(
        built["keras"].predict(x, verbose=0), want, atol=1e-5 * np.abs(want).max()
    )
    for key in ("kerasnorm float32", "keras float32"):
        assert row[key]["max_rel"] < 1e-4, row[key]
        assert row[key]["flex"] == [] and row[key]["ms"] > 0
    for key in ("kerasnorm int8", "keras int8"):
        assert row[key]["rms_rel"] < 0.2, row[key]
    assert (
        "| conv + LayerNorm vs Keras LayerNormalization | keras (Keras layers) |"
        in (tables.side_by_side_table([row]))
    )
