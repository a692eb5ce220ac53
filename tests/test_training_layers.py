"""Every public kerasnorm layer, cell and block trains under XLA and mixed precision.

The list comes from `kerasnorm.layers.__all__`, so a new public class joins
automatically and fails here until it has a builder below.
"""

import keras
import numpy as np
import pytest

import kerasnorm.layers
import kerasnorm.training

# kerasnorm.training compiles with tf.function and XLA: TensorFlow.
pytestmark = pytest.mark.tf_only

PUBLIC_CLASSES = sorted(
    name
    for name in kerasnorm.layers.__all__
    if isinstance(getattr(kerasnorm.layers, name), type)
)


def _model(shape, *layers):
    return keras.Sequential(
        [keras.Input(shape), *layers, keras.layers.Flatten(), keras.layers.Dense(1)]
    )


def _decoder():
    target, source = keras.Input((5, 8)), keras.Input((6, 8))
    y = kerasnorm.layers.TransformerDecoderBlock(2, 4, 16)(target, source)
    return keras.Model(
        [target, source], keras.layers.Dense(1)(keras.layers.Flatten()(y))
    )


L = kerasnorm.layers
BUILDERS = {
    "LayerNorm": lambda: _model((4, 8), L.LayerNorm()),
    "RMSNorm": lambda: _model((4, 8), L.RMSNorm(partial=0.5)),
    "GroupNorm": lambda: _model((4, 8), L.GroupNorm(groups=4)),
    "InstanceNorm": lambda: _model((4, 8), L.InstanceNorm()),
    "WeightNorm": lambda: _model((4, 8), L.WeightNorm(keras.layers.Dense(8))),
    "LayerNormLSTM": lambda: _model((5, 4), L.LayerNormLSTM(8, return_sequences=True)),
    "LayerNormGRU": lambda: _model((5, 4), L.LayerNormGRU(8, return_sequences=True)),
    "LayerNormSimpleRNN": lambda: _model(
        (5, 4), L.LayerNormSimpleRNN(8, return_sequences=True)
    ),
    "LayerNormLSTMCell": lambda: _model(
        (5, 4), keras.layers.RNN(L.LayerNormLSTMCell(8), return_sequences=True)
    ),
    "LayerNormGRUCell": lambda: _model(
        (5, 4), keras.layers.RNN(L.LayerNormGRUCell(8), return_sequences=True)
    ),
    "LayerNormSimpleRNNCell": lambda: _model(
        (5, 4), keras.layers.RNN(L.LayerNormSimpleRNNCell(8), return_sequences=True)
    ),
    "NormResidual": lambda: _model(
        (4, 8), L.NormResidual(keras.layers.Dense(8), "post")
    ),
    "TransformerEncoderBlock": lambda: _model(
        (5, 8),
        L.TransformerEncoderBlock(2, 4, 16, norm_position="deepnorm", num_layers=2),
    ),
    "TransformerDecoderBlock": _decoder,
}


def _batch(model, rng):
    xs = [
        rng.standard_normal((8, *i.shape[1:])).astype("float32") for i in model.inputs
    ]
    return (xs if len(xs) > 1 else xs[0]), rng.standard_normal((8, 1)).astype("float32")


# XLA compiles of the time loops and attention blocks take 10-25 s each on a
# busy 2-core machine.
SLOW = ("LSTM", "GRU", "SimpleRNN", "Transformer")


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow)
        if any(part in name for part in SLOW)
        else name
        for name in PUBLIC_CLASSES
    ],
)
def test_public_class_trains_under_xla(name, policy):
    if name not in BUILDERS:
        pytest.fail(
            f"kerasnorm.layers.{name} has no builder in tests/test_training_layers.py "
            "BUILDERS: add one so that it is trained under XLA and mixed precision."
        )
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = BUILDERS[name]()
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
