"""`kerasnorm demo`: train a kerasnorm model under XLA, export and verify it.

Trains a small conv net on scikit-learn's bundled 8x8 digits (no download):
a Conv+BatchNorm stem, GroupNorm and InstanceNorm convolutions, an MLP head
with LayerNorm and pRMSNorm, compiled with `jit_compile=True`. It then saves
the `.keras` file and runs `kerasnorm export` on it: BatchNorm folded, a
SavedModel for TF Serving and float32/float16/int8 `.tflite` files, each
checked against the Keras model, and finally reports test accuracy of every
artifact.
"""

import os
import time


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "demo",
        help="train a kerasnorm model on digits under XLA, export and verify it",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--epochs", type=int, default=8, help="default: 8")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument(
        "--out",
        default="demo_output",
        help="directory for the .keras file and the exported artifacts; the "
        "demo replaces its own files there (default: demo_output)",
    )
    parser.add_argument(
        "--no-export", action="store_true", help="only train and evaluate"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's and the TFLite converter's own logs",
    )
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
        name="digits",
    )


def train(epochs, seed):
    """The trained model and the data it was trained and tested on."""
    import keras

    keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = load_digits(seed)
    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    print(
        f"Training {model.name} ({model.count_params()} params) on digits "
        f"({len(x_train)} train, {len(x_test)} test) for {epochs} epochs "
        "with jit_compile=True"
    )
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=64, epochs=epochs, verbose=2)
    print(f"trained in {time.perf_counter() - start:.1f} s")
    return model, (x_train, y_train, x_test, y_test)


def run(args):
    import numpy as np

    model, (x_train, _, x_test, y_test) = train(args.epochs, args.seed)
    accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), -1) == y_test))
    print(f"Keras test accuracy: {accuracy:.4f}")
    if args.no_export:
        return 0

    from kerasnorm.cli import main as cli_main

    os.makedirs(args.out, exist_ok=True)
    model_path = os.path.join(args.out, "digits.keras")
    calibration_path = os.path.join(args.out, "calibration.npy")
    model.save(model_path)
    np.save(calibration_path, x_train[:200])
    print(f"\nkerasnorm export {model_path} ...")
    status = cli_main(
        [
            "export",
            model_path,
            "--out",
            args.out,
            "--saved-model",
            "--tflite",
            "--quantize",
            "float16",
            "--quantize",
            "int8",
            "--calibration",
            calibration_path,
            "--force",
            *(["--verbose"] if args.verbose else []),
        ]
    )
    if status:
        return status
    print("\nTest accuracy of every artifact:")
    for name, acc in artifact_accuracies(args.out, x_test, y_test):
        print(f"  {name:<28} {acc:.4f}")
    return 0


def artifact_accuracies(out, x_test, y_test):
    """(artifact, accuracy) for the SavedModel and each .tflite in `out`."""
    import numpy as np
    import tensorflow as tf

    from kerasnorm.export import litert

    results = []
    saved = os.path.join(out, "digits", "1")
    serve = tf.saved_model.load(saved).signatures["serving_default"]
    logits = next(iter(serve(image=tf.constant(x_test)).values())).numpy()
    results.append(("digits/1 (SavedModel)", np.mean(np.argmax(logits, -1) == y_test)))
    for name in sorted(os.listdir(out)):
        if name.endswith(".tflite"):
            with open(os.path.join(out, name), "rb") as f:
                logits = litert.Runner(f.read()).predict(x_test)[0]
            results.append((name, np.mean(np.argmax(logits, -1) == y_test)))
    return [(name, float(acc)) for name, acc in results]
