"""`kerasnorm demo`: train a small model with kerasnorm layers under XLA.

Trains on scikit-learn's bundled 8x8 digits (no download), a conv net with
GroupNorm and InstanceNorm and an MLP head with LayerNorm and pRMSNorm, with
`jit_compile=True`, and prints the test accuracy.
"""

import time


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "demo", help="train a small kerasnorm model on the digits data (XLA)"
    )
    parser.add_argument("--epochs", type=int, default=5, help="default: 5")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.set_defaults(func=run)


def load_digits(seed=0):
    """scikit-learn's digits as (x_train, y_train, x_test, y_test), x in [0, 1]."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as err:
        raise SystemExit(
            "The demo trains on scikit-learn's digits: "
            'pip install "kerasnorm[examples]"'
        ) from err
    data = sk_load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def build_model():
    import keras

    import kerasnorm

    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            kerasnorm.GroupNorm(groups=8),
            keras.layers.ReLU(),
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            kerasnorm.InstanceNorm(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64),
            kerasnorm.LayerNorm(),
            keras.layers.ReLU(),
            keras.layers.Dense(64),
            kerasnorm.RMSNorm(partial=0.25),
            keras.layers.ReLU(),
            keras.layers.Dense(10),
        ],
        name="kerasnorm_demo",
    )


def run(args):
    import keras

    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    print(
        f"Training {model.name} on digits ({len(x_train)} train, "
        f"{len(x_test)} test) for {args.epochs} epochs with jit_compile=True"
    )
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=2)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy {accuracy:.3f} after {time.perf_counter() - start:.1f} s")
    return 0
