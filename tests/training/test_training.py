"""kerasnorm.training on one device: compile, the XLA check, measure, train_step."""

import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasnorm.layers
import kerasnorm.training
from kerasnorm.training._compile import offending_layer
from kerasnorm.training._measure import median_step_times

# kerasnorm.training compiles with tf.function and XLA: TensorFlow.
pytestmark = pytest.mark.tf_only


class StringRoundTrip(keras.layers.Layer):
    """The identity through tf.strings, which XLA has no kernels for."""

    def call(self, x):
        text = tf.strings.as_string(x, precision=9)
        return x + 0.0 * tf.stop_gradient(tf.strings.to_number(text))


MSE = keras.losses.MeanSquaredError()


def mlp(*extra):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16),
            kerasnorm.layers.LayerNorm(),
            *extra,
            keras.layers.Dense(1),
        ]
    )


def batch(n=16):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((n, 8)).astype("float32"),
        rng.standard_normal((n, 1)).astype("float32"),
    )


def bad_model():
    inner = keras.Sequential(
        [keras.layers.Dense(16), StringRoundTrip(name="strings")], name="inner"
    )
    return mlp(inner)


def test_incompatible_layer_is_named():
    with pytest.raises(
        kerasnorm.training.XLACompileError,
        match=r"Layer 'inner/strings' \(StringRoundTrip\).*cannot be compiled with "
        r"XLA.*op AsString.*fallback=True",
    ) as info:
        kerasnorm.training.compile(
            bad_model(), optimizer="sgd", loss="mse", jit_compile=True, sample=batch()
        )
    assert isinstance(info.value.layer, StringRoundTrip)


def test_fallback_warns_and_trains_without_xla():
    model = bad_model()
    x, y = batch()
    with pytest.warns(UserWarning, match=r"Layer 'inner/strings' \(StringRoundTrip\)"):
        kerasnorm.training.compile(
            model,
            # A step small enough to descend on every stack (0.1 diverged on
            # Keras 3.10 with oneDNN off).
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            jit_compile="measure",
            fallback=True,
            sample=(x, y),
        )
    assert model.jit_compile is False
    losses = model.fit(x, y, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]


def test_sample_check_leaves_weights_and_optimizer_untouched():
    model = mlp()
    before = [w.copy() for w in model.get_weights()]
    kerasnorm.training.compile(
        model, optimizer="adam", loss="mse", jit_compile=True, sample=batch()
    )
    assert model.jit_compile is True
    assert int(model.optimizer.iterations) == 0
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(float(v) == 0 for v in model.metrics[0].variables)


def test_jit_compile_true_is_xla_on_cpu_and_trains_like_keras():
    # Keras' "auto" means no XLA on a CPU-only machine; True forces it.
    x, y = batch(32)
    model = kerasnorm.training.compile(
        mlp(), optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True
    )
    assert model.jit_compile is True
    reference = mlp()
    reference.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        model.fit(x, y, **fit).history["loss"],
        reference.fit(x, y, **fit).history["loss"],
        rtol=1e-5,
    )


def test_measure_without_sample_turns_xla_on(caplog):
    with caplog.at_level(logging.INFO, logger="kerasnorm.training"):
        model = kerasnorm.training.compile(mlp(), optimizer="sgd", loss="mse")
    assert model.jit_compile is True
    assert "no sample to measure on" in caplog.text


def test_measure_picks_the_fastest_mode_and_records_all(caplog):
    model = mlp()
    with caplog.at_level(logging.INFO, logger="kerasnorm.training"):
        kerasnorm.training.compile(
            model, optimizer="adam", loss="mse", jit_compile="measure", sample=batch()
        )
    measured = model.jit_compile_measurement
    times = {
        True: measured.xla_step_seconds,
        False: measured.no_xla_step_seconds,
        "norms": measured.norms_step_seconds,
    }
    assert measured.jit_compile == min(times, key=times.get)
    assert measured.chosen_step_seconds == min(times.values())
    assert kerasnorm.training.jit_compile_mode(model) == measured.jit_compile
    assert model.jit_compile is (measured.jit_compile is True)
    assert 0 < measured.xla_step_seconds < measured.xla_first_step_seconds
    assert 0 < measured.no_xla_step_seconds < measured.no_xla_first_step_seconds
    assert 0 < measured.norms_step_seconds < measured.norms_first_step_seconds
    assert 5 <= measured.rounds <= 11
    assert f"jit_compile={measured.jit_compile!r}: step" in caplog.text
    assert int(model.optimizer.iterations) == 0


def test_measure_without_norm_layers_times_two_modes():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    kerasnorm.training.compile(model, optimizer="sgd", loss="mse", sample=batch())
    measured = model.jit_compile_measurement
    assert measured.norms_step_seconds is None
    assert measured.norms_first_step_seconds is None
    assert measured.jit_compile in (True, False)
    assert "normalization layers only" not in str(measured)


class StringLayerNorm(kerasnorm.layers.LayerNorm):
    """A LayerNorm with an op XLA cannot compile."""

    def call(self, x):
        return StringRoundTrip().call(super().call(x))


def convnet(*extra):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            kerasnorm.layers.GroupNorm(4),
            keras.layers.ReLU(),
            *extra,
            keras.layers.Conv2D(8, 3, strides=2, padding="same"),
            kerasnorm.layers.InstanceNorm(),
            keras.layers.Flatten(),
            keras.layers.Dense(16),
            kerasnorm.layers.RMSNorm(partial=0.5),
            keras.layers.Dense(1),
        ]
    )


def images(n=16):
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((n, 6, 6, 3)).astype("float32"),
        rng.standard_normal((n, 1)).astype("float32"),
    )


def test_norms_mode_xla_compiles_the_norm_layers_and_nothing_else():
    x, y = batch()
    # An op without XLA kernel in a norm layer fails the step...
    with pytest.raises(kerasnorm.training.XLACompileError):
        kerasnorm.training.compile(
            mlp(StringLayerNorm()),
            optimizer="sgd",
            loss="mse",
            jit_compile="norms",
            sample=(x, y),
        )
    # ...and the same op outside one trains: only norm layers are compiled.
    model = kerasnorm.training.compile(
        mlp(StringRoundTrip()), optimizer="sgd", loss="mse", jit_compile="norms"
    )
    assert kerasnorm.training.jit_compile_mode(model) == "norms"
    assert model.jit_compile is False
    assert np.isfinite(model.fit(x, y, epochs=1, verbose=0).history["loss"]).all()


@pytest.mark.parametrize("build", [convnet, mlp], ids=["convnet", "mlp"])
def test_norms_mode_trains_like_no_xla(build):
    x, y = images() if build is convnet else batch()
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    trained = {}
    for mode in ("norms", False):
        model = kerasnorm.training.compile(
            build(), optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=mode
        )
        history = model.fit(x, y, **fit).history["loss"]
        trained[mode] = (history, model.get_weights())
    np.testing.assert_allclose(trained["norms"][0], trained[False][0], rtol=1e-5)
    for a, b in zip(trained["norms"][1], trained[False][1], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert trained["norms"][0][-1] < trained["norms"][0][0]


def test_norms_mode_reaches_nested_norm_layers_and_leaves_inference_alone():
    keras.utils.set_random_seed(0)
    block = kerasnorm.layers.TransformerEncoderBlock(2, 4, 16)
    model = keras.Sequential([keras.Input((5, 8)), block, keras.layers.Dense(1)])
    x = np.random.default_rng(0).standard_normal((8, 5, 8)).astype("float32")
    y = np.zeros((8, 5, 1), "float32")
    kerasnorm.training.compile(model, optimizer="sgd", loss="mse", jit_compile="norms")
    norms = [
        layer
        for layer in block._flatten_layers(include_self=False)
        if isinstance(layer, kerasnorm.layers.LayerNorm)
    ]
    assert len(norms) == 2
    model.fit(x, y, epochs=1, verbose=0)
    # The XLA-compiled calls exist only while the step is traced.
    assert not any("call" in vars(layer) for layer in norms)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), model(x, training=False), atol=1e-6
    )


def test_norms_mode_passes_masks_to_the_compiled_layers():
    # The mask reaches the compiled `call` as a tensor argument.
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 20, size=(16, 6))
    tokens[:, 4:] = 0  # padding
    y = rng.standard_normal((16, 1)).astype("float32")
    losses = {}
    for mode in ("norms", False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((6,), dtype="int32"),
                keras.layers.Embedding(20, 8, mask_zero=True),
                kerasnorm.layers.LayerNorm(axis=(1, 2)),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        kerasnorm.training.compile(
            model, optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=mode
        )
        fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
        losses[mode] = model.fit(tokens, y, **fit).history["loss"]
    np.testing.assert_allclose(losses["norms"], losses[False], rtol=1e-5)


def keras_norms_convnet():
    keras.utils.set_random_seed(0)
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            L.Conv2D(8, 3, padding="same"),
            L.BatchNormalization(),
            L.ReLU(),
            L.Conv2D(8, 3, padding="same"),
            L.GroupNormalization(4),
            L.Flatten(),
            L.Dense(16),
            L.LayerNormalization(),
            L.RMSNormalization(),
            L.Dense(1),
        ]
    )


def test_norms_mode_covers_keras_normalization_layers():
    from kerasnorm.training._norm_xla import norm_layers

    model = keras_norms_convnet()
    kinds = [type(layer).__name__ for layer in norm_layers(model)]
    assert kinds == [
        "BatchNormalization",
        "GroupNormalization",
        "LayerNormalization",
        "RMSNormalization",
    ]
    # A synchronized BatchNormalization all-reduces inside `call`: left out.
    synced = keras.Sequential(
        [keras.Input((4,)), keras.layers.BatchNormalization(synchronized=True)]
    )
    assert norm_layers(synced) == []
    x, y = images()
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    trained = {}
    for mode in ("norms", False):
        model = kerasnorm.training.compile(
            keras_norms_convnet(),
            optimizer=keras.optimizers.SGD(0.05),
            loss="mse",
            jit_compile=mode,
        )
        history = model.fit(x, y, **fit).history["loss"]
        trained[mode] = (history, model.get_weights())
    np.testing.assert_allclose(trained["norms"][0], trained[False][0], rtol=1e-5)
    # Every weight, the BatchNorm's moving statistics included.
    for a, b in zip(trained["norms"][1], trained[False][1], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_norms_mode_needs_a_norm_layer():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"has none\. Pass jit_compile=True"):
        kerasnorm.training.compile(
            model, optimizer="sgd", loss="mse", jit_compile="norms"
        )
    assert not model.compiled


def test_recompiling_leaves_norms_mode():
    model = kerasnorm.training.compile(
        mlp(), optimizer="sgd", loss="mse", jit_compile="norms"
    )
    kerasnorm.training.compile(model, optimizer="sgd", loss="mse", jit_compile=False)
    assert kerasnorm.training.jit_compile_mode(model) is False


class FakeClock:
    """A timer that advances only when a fake step runs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    ("xla", "no_xla", "expected"),
    [
        # XLA faster in every round except two disturbed ones.
        ([1.0, 1.0, 9.0, 1.0, 9.0], [2.0, 2.0, 2.0, 2.0, 2.0], {True: 1.0, False: 2.0}),
        # XLA slower (the CNN case): medians, not means, decide.
        ([3.0, 3.0, 0.1, 3.0, 3.0], [2.0, 2.5, 2.0, 9.0, 2.0], {True: 3.0, False: 2.0}),
    ],
)
def test_median_step_times_interleaves_and_takes_medians(xla, no_xla, expected):
    clock = FakeClock()
    durations = {True: list(xla), False: list(no_xla)}
    order = []

    def run(mode):
        order.append(mode)
        clock.now += durations[mode].pop(0)

    assert median_step_times(run, rounds=5, timer=clock) == (expected, 5)
    # The first of each round alternates between the modes.
    assert order[0::2] == [True, False, True, False, True]


@pytest.mark.parametrize(
    ("durations", "expected_rounds", "expected"),
    [
        # Clearly apart after 3 rounds: no more rounds.
        ({True: [1.5] * 9, False: [2.0] * 9, "norms": [1.0] * 9}, 3, "norms"),
        # The fastest two 2 % apart: sampled up to max_rounds.
        ({True: [1.0] * 9, False: [1.02] * 9, "norms": [3.0] * 9}, 7, "xla"),
        # Close at first, apart once more rounds came in.
        (
            {True: [1.0] * 6, False: [1.01, 1.01, 1.01, 2.0, 2.0, 2.0]},
            6,
            "xla",
        ),
    ],
)
def test_median_step_times_samples_close_calls_longer(
    durations, expected_rounds, expected
):
    clock = FakeClock()
    durations = {mode: list(d) for mode, d in durations.items()}
    seen = []

    def run(mode):
        seen.append(mode)
        clock.now += durations[mode].pop(0)

    medians, rounds = median_step_times(
        run, 3, clock, modes=list(durations), max_rounds=7, separation=0.05
    )
    assert rounds == expected_rounds
    assert len(seen) == rounds * len(durations)
    fastest = min(medians, key=medians.get)
    assert {True: "xla"}.get(fastest, fastest) == expected
    # Every mode leads a round in turn.
    width = len(durations)
    leaders = seen[0 : width * width : width]
    assert sorted(map(str, leaders)) == sorted(map(str, durations))


def test_offending_layer_walks_nested_scopes_with_suffixes():
    model = bad_model()
    message = (
        "Detected unsupported operations ... {{node sequential_1/inner_1/strings_3/"
        "AsString}} ..."
    )
    layer, path = offending_layer(model, message)
    assert isinstance(layer, StringRoundTrip)
    assert path == ["inner", "strings"]
    assert offending_layer(model, "no node here") == (None, [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jit_compile": "auto"}, "Received: jit_compile='auto'"),
        ({"jit_compile": 1}, "Received: jit_compile=1"),
        ({"fallback": "yes"}, "Received: fallback='yes'"),
        ({"run_eagerly": True}, "run_eagerly=True.*Received: jit_compile='measure'"),
        ({"sample": np.zeros((2, 8))}, "sample of type ndarray"),
    ],
)
def test_compile_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kerasnorm.training.compile(mlp(), optimizer="sgd", loss="mse", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jit_compile": "measure"}, "Received: jit_compile='measure'"),
        ({"clip_norm": 0}, "Received: clip_norm=0"),
        ({"jit_compile": "auto"}, "True, False or 'norms'"),
    ],
)
def test_train_step_rejects_bad_arguments(kwargs, message):
    arguments = dict(
        model=mlp(), optimizer=keras.optimizers.SGD(), loss_fn=MSE, **kwargs
    )
    with pytest.raises(ValueError, match=message):
        kerasnorm.training.train_step(**arguments)


def test_train_step_needs_a_callable_loss():
    with pytest.raises(ValueError, match=r"callable.*Received: loss_fn='mse'"):
        kerasnorm.training.train_step(mlp(), keras.optimizers.SGD(), "mse")


def test_train_step_needs_a_built_model():
    model = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=re.escape("Received: model='sequential")):
        kerasnorm.training.train_step(
            model, keras.optimizers.SGD(), keras.losses.MeanSquaredError()
        )


def _reference_sgd(model, x, y, steps, lr, clip_norm=None):
    """Plain eager SGD on the mean squared error: the equations, no kerasnorm."""
    variables = model.trainable_variables
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, variables)
        if clip_norm is not None:
            norm = np.sqrt(sum(float(tf.reduce_sum(g**2)) for g in grads))
            grads = [g * min(1.0, clip_norm / norm) for g in grads]
        for v, g in zip(variables, grads, strict=True):
            v.assign_sub(lr * g)
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("jit_compile", [True, False, "norms"])
@pytest.mark.parametrize("clip_norm", [None, 0.05])
@pytest.mark.parametrize(
    "loss_fn",
    [keras.losses.MeanSquaredError(), keras.losses.mean_squared_error],
    ids=["Loss", "function"],
)
def test_train_step_matches_plain_sgd(jit_compile, clip_norm, loss_fn):
    x, y = batch()
    model = mlp()
    step = kerasnorm.training.train_step(
        model,
        keras.optimizers.SGD(0.1),
        loss_fn,
        jit_compile=jit_compile,
        clip_norm=clip_norm,
    )
    losses = [float(step(x, y)) for _ in range(3)]
    expected = _reference_sgd(mlp(), x, y, 3, 0.1, clip_norm)
    for a, b in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert losses[-1] < losses[0]
    assert step.jit_compile is jit_compile


def test_train_step_norms_mode_compiles_the_norm_layers_only():
    x, y = batch()
    # The tf.strings op XLA cannot compile: in a norm layer the step fails...
    step = kerasnorm.training.train_step(
        mlp(StringLayerNorm()), keras.optimizers.SGD(0.1), MSE, jit_compile="norms"
    )
    with pytest.raises(tf.errors.OpError, match="AsString"):
        step(x, y)
    # ...elsewhere it trains, and the layers keep their own `call`.
    model = mlp(StringRoundTrip())
    step = kerasnorm.training.train_step(
        model, keras.optimizers.SGD(0.1), MSE, jit_compile="norms"
    )
    losses = [float(step(x, y)) for _ in range(3)]
    assert losses[-1] < losses[0]
    assert not any("call" in vars(layer) for layer in model.layers)


def test_train_step_norms_mode_needs_a_norm_layer():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"has none\. Pass jit_compile=True"):
        kerasnorm.training.train_step(
            model, keras.optimizers.SGD(0.1), MSE, jit_compile="norms"
        )


def test_train_step_under_mixed_float16_uses_a_loss_scale_optimizer():
    keras.config.set_dtype_policy("mixed_float16")
    model = mlp()
    step = kerasnorm.training.train_step(
        model,
        keras.optimizers.Adam(1e-2),
        keras.losses.MeanSquaredError(),
        clip_norm=1.0,
    )
    assert isinstance(step.optimizer, keras.optimizers.LossScaleOptimizer)
    x, y = batch()
    losses = [float(step(x, y)) for _ in range(6)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_norms_mode_on_a_real_architecture():
    # keras.applications' MobileNetV2: 52 BatchNormalization layers inside
    # a Functional model, depthwise convolutions, ReLU6.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 4, size=16)
    results = {}
    for mode in ("norms", False):
        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=4
        )
        kerasnorm.training.compile(
            model,
            optimizer=keras.optimizers.SGD(0.01),
            loss="sparse_categorical_crossentropy",
            jit_compile=mode,
        )
        first = float(model.train_on_batch(x[:8], y[:8]))
        second = float(model.train_on_batch(x[8:], y[8:]))
        results[mode] = (first, second, model.predict(x, verbose=0))
    norms, plain = results["norms"], results[False]
    # The same forward pass up to rounding...
    np.testing.assert_allclose(norms[0], plain[0], rtol=1e-4)
    # ...and the same update: batch-8 BatchNorm through 52 layers amplifies
    # rounding in the training-mode loss, by how much depends on the kernels:
    # 7e-4 with oneDNN on, 3.5e-3 with it off (whole-step XLA differs from no
    # XLA by 3e-3 on the same step). 1e-2 leaves room for other CPUs; a step
    # that skips the update (learning rate 0) changes this loss by 0.18.
    np.testing.assert_allclose(norms[1], plain[1], rtol=1e-2)
    np.testing.assert_allclose(norms[2], plain[2], atol=1e-4)
