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
            optimizer=keras.optimizers.SGD(0.1),
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


def test_measure_picks_the_faster_mode_and_records_both(caplog):
    model = mlp()
    with caplog.at_level(logging.INFO, logger="kerasnorm.training"):
        kerasnorm.training.compile(
            model, optimizer="adam", loss="mse", jit_compile="measure", sample=batch()
        )
    measured = model.jit_compile_measurement
    assert model.jit_compile is measured.jit_compile
    faster = measured.xla_step_seconds <= measured.no_xla_step_seconds
    assert measured.jit_compile is faster
    assert 0 < measured.xla_step_seconds < measured.xla_first_step_seconds
    assert 0 < measured.no_xla_step_seconds < measured.no_xla_first_step_seconds
    assert f"jit_compile={measured.jit_compile}: step" in caplog.text
    assert int(model.optimizer.iterations) == 0


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

    assert median_step_times(run, rounds=5, timer=clock) == expected
    # The first of each round alternates between the modes.
    assert order[0::2] == [True, False, True, False, True]


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
    ],
)
def test_train_step_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kerasnorm.training.train_step(
            mlp(), keras.optimizers.SGD(), keras.losses.MeanSquaredError(), **kwargs
        )


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


@pytest.mark.parametrize("jit_compile", [True, False])
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
