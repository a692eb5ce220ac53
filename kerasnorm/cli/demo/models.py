"""The demo's two networks, built with seeded initial weights."""


def build_model():
    """The conv net: a Conv+BatchNorm stem, then every kerasnorm norm layer."""
    import keras

    from kerasnorm import norms

    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            norms.GroupNorm(groups=8),
            keras.layers.ReLU(),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            norms.InstanceNorm(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64),
            norms.LayerNorm(),
            keras.layers.ReLU(),
            keras.layers.Dense(64),
            norms.RMSNorm(partial=0.25),
            keras.layers.ReLU(),
            keras.layers.Dense(10, name="logits"),
        ],
        name="conv_net",
    )


def build_lstm_model(units=64):
    """An LN-LSTM reading a digit as a sequence of its 8 rows of 8 pixels."""
    import keras

    from kerasnorm import recurrent

    return keras.Sequential(
        [
            keras.Input((8, 8), name="rows"),
            # Unrolled: TensorFlow 2.21's int8 converter crashes the process
            # on the while loop of a rolled RNN (Keras' own LSTM too), and 8
            # fixed steps unroll cheaply.
            recurrent.LayerNormLSTM(units, unroll=True),
            keras.layers.Dense(10, name="logits"),
        ],
        name="ln_lstm",
    )


def seeded(seed, build, *args):
    """`build(*args)` with every random generator seeded: the same initial
    weights, and with `train` the same model, on every run."""
    import keras

    keras.utils.set_random_seed(seed)
    return build(*args)
