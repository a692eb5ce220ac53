"""A norm's affine folded into the next linear layer (`fold/affine.py`,
docs/design.md §4): what a float32 `.tflite` file does to remove the
affine's full-size multiply (and add).

Every case is checked against the unfolded model, which computes the norm
whole: folding may change which layer computes what, never the function.
The matrix crosses each norm (with and without an offset, gains of either
sign) with each kind of layer on the way and each kind of linear layer at
the end; the never-fold cases are listed one by one."""

import warnings

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.fold.check import SelfCheck
from kerasnorm.export.fold.rewrite import fold_unchecked
from kerasnorm.export.numerics import metrics

pytestmark = pytest.mark.tf_only

L = keras.layers
SIDE, CHANNELS = 6, 8

NORMS = {
    "RMSNorm": lambda: kerasnorm.RMSNorm(),
    "RMSNorm(center)": lambda: kerasnorm.RMSNorm(center=True),
    "pRMSNorm": lambda: kerasnorm.RMSNorm(partial=0.5),
    "LayerNorm": lambda: kerasnorm.LayerNorm(),
    "LayerNorm(center=False)": lambda: kerasnorm.LayerNorm(center=False),
    "LayerNorm(scale=False)": lambda: kerasnorm.LayerNorm(scale=False),
    "GroupNorm": lambda: kerasnorm.GroupNorm(groups=2),
    "InstanceNorm": lambda: kerasnorm.InstanceNorm(),
    "keras LayerNormalization": lambda: L.LayerNormalization(),
}

# The layers between the norm and the linear layer: (builder of the layers
# on a channels-last image, whether the path needs every gain >= 0, whether
# it stops an offset).
PATHS = {
    "direct": (lambda: [], False, False),
    "ReLU": (lambda: [L.ReLU()], True, True),
    "Activation(relu)": (lambda: [L.Activation("relu")], True, True),
    "LeakyReLU": (lambda: [L.LeakyReLU(0.1)], True, True),
    "PReLU": (lambda: [L.PReLU(alpha_initializer="random_uniform")], True, True),
    "Dropout": (lambda: [L.Dropout(0.3), L.SpatialDropout2D(0.2)], False, False),
    "AveragePooling": (lambda: [L.AveragePooling2D(2, padding="same")], False, False),
    "MaxPooling": (lambda: [L.MaxPooling2D(2)], True, False),
    "ReLU, MaxPooling": (lambda: [L.ReLU(), L.MaxPooling2D(2)], True, True),
}
# The linear layer the path ends in: (builder, whether an offset folds into
# it: zero padding or a transposed convolution's border sees no shift).
LINEAR = {
    "Conv2D(valid)": (lambda: L.Conv2D(5, 3), True),
    "Conv2D(same)": (lambda: L.Conv2D(5, 3, padding="same"), False),
    "Dense": (lambda: L.Dense(5), True),
    "DepthwiseConv2D": (lambda: L.DepthwiseConv2D(3, depth_multiplier=2), True),
    "SeparableConv2D": (lambda: L.SeparableConv2D(5, 3), True),
    "Conv2DTranspose": (lambda: L.Conv2DTranspose(5, 3), False),
}
# The norms' weights: gains in [0.5, 1.5] (or of either sign), offsets
# random, or zero ("no offset": an untrained one folds like none).
WEIGHTS = ("positive", "mixed signs", "positive, zero offset")


def _randomize(model, weights, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        name = w.path.rsplit("/", 1)[-1]
        if name == "gamma":
            value = rng.uniform(0.5, 1.5, w.shape)
            if weights == "mixed signs":
                value *= rng.choice([-1.0, 1.0], w.shape)
        elif name == "beta":
            value = (
                np.zeros(w.shape) if "zero" in weights else rng.normal(0, 0.5, w.shape)
            )
        else:
            value = np.asarray(w.numpy()) + 0.3 * rng.standard_normal(w.shape)
        w.assign(value.astype(w.dtype))
    return model


def _image_model(norm, path, linear):
    inputs = keras.Input((SIDE, SIDE, 3))
    x = norm()(L.Conv2D(CHANNELS, 3, padding="same")(inputs))
    for layer in path():
        x = layer(x)
    return keras.Model(inputs, L.Dense(2)(L.Flatten()(linear()(x))))


def _images(n=3, seed=1):
    return np.random.default_rng(seed).normal(size=(n, SIDE, SIDE, 3)).astype("float32")


def _fold(model, x):
    """The folded model and its report, after checking that it computes
    what `model` computes (to float32 rounding) and left `model` alone."""
    before = [np.array(w.numpy()) for w in model.weights]
    want = keras.tree.flatten(model(x))
    folded, report = fold_unchecked(model, affines=True)
    for a, b in zip(want, keras.tree.flatten(folded(x)), strict=True):
        assert metrics.relative_error(np.asarray(a), np.asarray(b)) <= 2e-6, report
    for w, value in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(np.asarray(w.numpy()), value)
    return folded, report


def _norms_with_affine(model):
    return [
        layer
        for layer in model.layers
        if isinstance(layer, tuple(type(f()) for f in NORMS.values()))
        and (layer.scale or layer.center)
    ]


def _expect_fold(norm, path, weights, offset_folds=True):
    _, needs_nonnegative, stops_offset = PATHS[path]
    probe = NORMS[norm]()
    offset = probe.center and "zero" not in weights
    if not (probe.scale or offset):
        return False  # nothing to fold: an offset of zeros alone
    if needs_nonnegative and weights == "mixed signs" and probe.scale:
        return False
    return not (offset and (stops_offset or not offset_folds))


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("norm", list(NORMS))
def test_every_norm_through_every_path(norm, path, weights):
    """Each norm and path, into a valid Conv2D: folded exactly where the
    rules say, and the same function either way."""
    keras.utils.set_random_seed(0)
    model = _randomize(
        _image_model(NORMS[norm], PATHS[path][0], LINEAR["Conv2D(valid)"][0]),
        weights,
    )
    folded, report = _fold(model, _images())
    expected = _expect_fold(norm, path, weights)
    assert bool(report.affines) == expected, report
    if expected:
        (fold,) = report.affines
        assert len(fold.through) == len(PATHS[path][0]())
        (copy,) = [
            layer for layer in folded.layers if layer.name == model.layers[2].name
        ]
        assert copy.gamma is None and copy.beta is None
        assert not _norms_with_affine(folded)
        assert report.changes() == 1
    else:
        assert folded.layers[2] is model.layers[2]


@pytest.mark.parametrize("weights", ["positive", "positive, zero offset"])
@pytest.mark.parametrize("linear", list(LINEAR))
@pytest.mark.parametrize("norm", ["RMSNorm", "LayerNorm"])
def test_every_linear_layer(norm, linear, weights):
    """Each linear layer takes the gain; an offset only where no zero padding
    or transposed border would miss it."""
    keras.utils.set_random_seed(0)
    build, offset_folds = LINEAR[linear]
    model = _randomize(_image_model(NORMS[norm], lambda: [], build), weights)
    _, report = _fold(model, _images())
    assert bool(report.affines) == _expect_fold(norm, "direct", weights, offset_folds)


def test_tokens_fan_out_and_pooling():
    """A token model: a norm read by two Dense layers (each takes the
    affine), and a final norm pooled over time into the head."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, CHANNELS))
    h = kerasnorm.LayerNorm(name="ln")(inputs)
    x = L.Dense(CHANNELS, name="a")(h) + L.Dense(CHANNELS, activation="relu", name="b")(
        h
    )
    y = L.GlobalAveragePooling1D(name="pool")(kerasnorm.RMSNorm(name="rms")(x))
    model = _randomize(keras.Model(inputs, L.Dense(2, name="head")(y)), "positive")
    x = np.random.default_rng(0).normal(size=(3, 5, CHANNELS)).astype("float32")
    _, report = _fold(model, x)
    assert sorted((f.norm, f.into, f.through, f.offset) for f in report.affines) == [
        ("ln", "a", (), True),
        ("ln", "b", (), True),
        ("rms", "head", ("pool",), False),
    ], report
    assert "Norm affines folded: 3" in str(report)


def _conv(x):
    return L.Conv2D(4, 3)(x)


def _rms_scaling():
    with warnings.catch_warnings():  # deprecated by Keras 3.15
        warnings.simplefilter("ignore")
        return L.LayerNormalization(rms_scaling=True)


def _two_reads(x):
    y = kerasnorm.RMSNorm()(x)
    return _conv(y) + _conv(y * y)


def _shared_norm(x):
    norm = kerasnorm.RMSNorm()
    return _conv(norm(x)) + _conv(norm(x * 2.0))


def _shared_conv(x):
    conv = L.Conv2D(4, 3)
    return conv(kerasnorm.RMSNorm()(x)) + conv(x)


# The models whose norm must not fold, by what stops it.
NEVER = {
    "read by a non-linear layer too": _two_reads,
    "a model output too": lambda x: [_conv(y := kerasnorm.RMSNorm()(x)), y],
    "a capped ReLU": lambda x: _conv(L.ReLU(max_value=6.0)(kerasnorm.RMSNorm()(x))),
    "a ReLU with a threshold": lambda x: _conv(
        L.ReLU(threshold=0.1)(kerasnorm.RMSNorm()(x))
    ),
    "ELU": lambda x: _conv(L.ELU()(kerasnorm.RMSNorm()(x))),
    # Without source (made by `eval`, as in a REPL): Keras cannot serialize it.
    "a lambda activation": lambda x: _conv(
        L.Activation(eval("lambda z: keras.ops.maximum(z, 0.0)", {"keras": keras}))(
            kerasnorm.RMSNorm()(x)
        )
    ),
    "the norm shared": _shared_norm,
    "the linear layer shared": _shared_conv,
    "the norm not over the last axis": lambda x: _conv(kerasnorm.LayerNorm(axis=1)(x)),
    "the norm over every axis": lambda x: _conv(kerasnorm.LayerNorm(axis=[1, 2, 3])(x)),
    "keras LayerNormalization over every axis": lambda x: _conv(
        L.LayerNormalization(axis=[1, 2, 3])(x)
    ),
    "keras LayerNormalization with rms_scaling": lambda x: _conv(_rms_scaling()(x)),
    "Flatten": lambda x: L.Dense(3)(L.Flatten()(kerasnorm.RMSNorm()(x))),
}


@pytest.mark.parametrize("case", list(NEVER))
def test_never_folds(case):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SIDE, SIDE, CHANNELS))
    model = _randomize(keras.Model(inputs, NEVER[case](inputs)), "positive")
    x = np.random.default_rng(0).normal(size=(2, SIDE, SIDE, CHANNELS))
    _, report = _fold(model, x.astype("float32"))
    assert not report.affines, report


def test_nested_model_folds_inside_and_not_across():
    """A norm and its Dense inside a sub-model fold (named by path); a norm
    whose output leaves the sub-model does not."""
    keras.utils.set_random_seed(0)
    inner_in = keras.Input((CHANNELS,))
    h = L.Dense(CHANNELS)(kerasnorm.RMSNorm()(inner_in))
    inner = keras.Model(inner_in, kerasnorm.RMSNorm()(h), name="inner")
    inputs = keras.Input((CHANNELS,))
    model = _randomize(keras.Model(inputs, L.Dense(2)(inner(inputs))), "positive")
    x = np.random.default_rng(0).normal(size=(4, CHANNELS)).astype("float32")
    _, report = _fold(model, x)
    (fold,) = report.affines
    assert fold.norm.startswith("inner/") and fold.into.startswith("inner/")


def test_the_float64_recheck_folds_alike():
    """The self-check's float64 twin folds the same affines (a half-precision
    model always takes that re-check)."""
    keras.utils.set_random_seed(0)
    model = _randomize(
        _image_model(NORMS["RMSNorm"], PATHS["ReLU"][0], LINEAR["Dense"][0]),
        "positive",
    )
    folded, report = fold_unchecked(model, affines=True)
    check = SelfCheck(
        model, folded, report, None, compute_dtype="float16", layers=model.layers
    )
    check.run(_images())
    assert report.check_error_float64 is not None
    assert report.check_error_float64 <= metrics.FLOAT64_TOLERANCE


CONV_NET_MODES = [None, "float16", "dynamic", "int8"]


@pytest.mark.parametrize("batch_size", [None, 1])
@pytest.mark.parametrize("quantize", CONV_NET_MODES)
def test_only_float32_files_fold_affines(quantize, batch_size, tmp_path):
    """Conv2D -> RMSNorm -> ReLU, twice, pooled into a Dense: the float32
    file has one `MUL` per norm (its statistics), the gains gone into the
    next layer; every other mode, and `fold=False`, keeps them. Each file
    passes `to_tflite`'s own check against the model."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SIDE, SIDE, 3))
    x = inputs
    for width in (8, 16):
        x = L.ReLU()(kerasnorm.RMSNorm()(L.Conv2D(width, 3, padding="same")(x)))
    pooled = L.GlobalAveragePooling2D()(x)
    model = _randomize(keras.Model(inputs, L.Dense(3)(pooled)), "positive")
    kwargs = {"representative_data": _images(16, seed=2)} if quantize == "int8" else {}
    path = tmp_path / "net.tflite"
    result = to_tflite(
        model,
        path,
        quantize=quantize,
        batch_size=batch_size,
        verify_inputs=_images(4),
        **kwargs,
    )
    ops = litert.op_counts(path.read_bytes())
    if quantize is None:
        assert [f.through for f in result.fold_report.affines] == [
            (model.layers[3].name,),
            (model.layers[6].name, model.layers[7].name),
        ]
        assert ops["MUL"] == 2, ops
        plain = to_tflite(
            model, tmp_path / "plain.tflite", fold=False, verify_inputs=_images(4)
        )
        assert plain.fold_report is None
        assert litert.op_counts((tmp_path / "plain.tflite").read_bytes())["MUL"] == 4
    else:
        assert not result.fold_report.affines, result.fold_report


def test_saved_model_keeps_the_norms(tmp_path):
    keras.utils.set_random_seed(0)
    model = _randomize(
        _image_model(NORMS["RMSNorm"], PATHS["ReLU"][0], LINEAR["Dense"][0]),
        "positive",
    )
    result = to_saved_model(model, tmp_path / "sm", verify_inputs=_images())
    assert not result.fold_report.affines


def _random_graph(seed):
    """A random conv net: norms of every kind (random gains of either sign,
    offsets random or zero) among activations, pooling, dropout, plain and
    depthwise convolutions, residual adds and fan-outs, pooled into a norm
    and a Dense."""
    rng = np.random.default_rng(seed)
    norms = list(NORMS.values())
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(CHANNELS, 3, padding="same")(inputs)
    side = 8
    for _ in range(rng.integers(3, 8)):
        kind = rng.choice(
            ["norm", "norm", "act", "pool", "drop", "conv", "residual", "fan"]
        )
        if kind == "norm":
            x = norms[rng.integers(len(norms))]()(x)
        elif kind == "act":
            layers = [L.ReLU(), L.LeakyReLU(0.2), L.PReLU(), L.ELU()]
            x = layers[rng.integers(len(layers))](x)
        elif kind == "pool" and side >= 4:
            pool = L.MaxPooling2D if rng.random() < 0.5 else L.AveragePooling2D
            x = pool(2, padding="same")(x)
            side //= 2
        elif kind == "drop":
            x = L.Dropout(0.5)(x)
        elif kind == "conv":
            x = (
                L.DepthwiseConv2D(3, padding="same")
                if rng.random() < 0.3
                else L.Conv2D(CHANNELS, 3, padding="same" if side < 4 else "valid")
            )(x)
            side = side if side < 4 else side - 2
        elif kind == "residual":
            x = x + L.Conv2D(CHANNELS, 1)(x)
        elif kind == "fan":
            x = L.Conv2D(CHANNELS, 1)(x) + L.Conv2D(CHANNELS, 1)(x)
    x = L.GlobalAveragePooling2D()(x)
    if rng.random() < 0.5:
        x = (kerasnorm.LayerNorm if rng.random() < 0.5 else kerasnorm.RMSNorm)()(x)
    model = keras.Model(inputs, L.Dense(3)(x))
    weights = WEIGHTS[rng.integers(len(WEIGHTS))]
    return _randomize(model, weights, seed=seed)


def test_random_graphs():
    """40 random conv nets fold to the same function; some norms fold."""
    folds = 0
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    for seed in range(40):
        keras.utils.set_random_seed(seed)
        _, report = _fold(_random_graph(seed), x)
        folds += len(report.affines)
    assert folds >= 10, folds
