"""Every public kerasnorm layer, cell and block trains under XLA and mixed precision.

The list comes from `kerasnorm.layers.__all__`, so a new public class joins
automatically and fails here until it has a case in tests/support/cases.py.
"""

import keras
import numpy as np
import pytest

import kerasnorm.layers
import kerasnorm.training
from tests.support.cases import CASES
from tests.support.cases import PUBLIC_CLASSES
from tests.support.cases import case

# kerasnorm.training compiles with tf.function and XLA: TensorFlow.
pytestmark = pytest.mark.tf_only


def _model(name):
    """The case's layer between `keras.Input`s and a Dense head over all its
    outputs (an LSTM's states too), so all of the layer feeds the loss."""
    this = case(name)
    inputs = [keras.Input(shape) for shape in this.shapes]
    outputs = keras.tree.flatten(
        this.make(getattr(kerasnorm.layers, name), keras)(*inputs)
    )
    flat = [keras.layers.Flatten()(y) for y in outputs]
    features = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    return keras.Model(inputs, keras.layers.Dense(1)(features))


def _batch(model, rng):
    xs = [
        rng.standard_normal((8, *i.shape[1:])).astype("float32") for i in model.inputs
    ]
    return (xs if len(xs) > 1 else xs[0]), rng.standard_normal((8, 1)).astype("float32")


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow)
        if name in CASES and CASES[name].slow_under_xla
        else name
        for name in PUBLIC_CLASSES
    ],
)
def test_public_class_trains_under_xla(name, policy):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = _model(name)
    step = kerasnorm.training.train_step(
        model, keras.optimizers.Adam(1e-2), keras.losses.MeanSquaredError()
    )
    before = [np.array(w, "float32") for w in model.get_weights()]
    x, y = _batch(model, np.random.default_rng(0))
    # Under mixed_float16 the loss scaler may skip the first steps while it
    # halves its initial scale of 2**15 (the LN-GRU skips four).
    losses = [float(step(x, y)) for _ in range(8)]
    after = [np.array(w, "float32") for w in model.get_weights()]
    assert np.all(np.isfinite(losses)), losses
    assert all(np.all(np.isfinite(w)) for w in after)
    assert max(np.max(np.abs(a - b)) for a, b in zip(after, before, strict=True)) > 0
    assert losses[-1] < losses[0]
