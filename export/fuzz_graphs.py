"""The random sequence models `export/fuzz_export.py` exports: the pieces
sequence models use, put together from a seed (`sequence_graph`), with
weights as a few training steps leave them (`_trained_like`)."""

from __future__ import annotations

import numpy as np

# Inputs per graph: what every mode is checked on.
SAMPLES = 32


def sequence_graph(seed):
    """`(model, x, description)`: a random small sequence model, its
    weights as training leaves them, and its inputs."""
    import keras

    import kerasnorm

    L = keras.layers
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    steps = int(rng.choice([8, 12, 16]))
    tokens = rng.random() < 0.35
    pieces = []
    if tokens:
        channels = int(rng.choice([4, 8]))
        inputs = keras.Input((steps,), dtype="int32")
        x = L.Embedding(20, channels, mask_zero=True)(inputs)
        pieces.append(f"Embedding(mask_zero)x{channels}")
        data = rng.integers(1, 20, size=(SAMPLES, steps))
        ends = rng.integers(steps // 2, steps + 1, size=SAMPLES)
        data[np.arange(steps)[None, :] >= ends[:, None]] = 0
        data = data.astype("int32")
    else:
        channels = int(rng.choice([1, 1, 4, 8]))
        inputs = keras.Input((steps, channels))
        x = inputs
        data = rng.normal(size=(SAMPLES, steps, channels)).astype("float32")
        pieces.append(f"frames x{channels}")

    def norm():
        groups = 1 if channels == 1 else 2
        options = [
            ("LayerNorm", lambda: kerasnorm.LayerNorm()),
            ("RMSNorm", lambda: kerasnorm.RMSNorm()),
            ("RMSNorm(center)", lambda: kerasnorm.RMSNorm(center=True)),
            ("GroupNorm", lambda: kerasnorm.GroupNorm(groups=groups)),
            ("InstanceNorm", lambda: kerasnorm.InstanceNorm()),
            ("keras LayerNormalization", lambda: L.LayerNormalization()),
            (
                "keras LayerNormalization(1e-6)",
                lambda: L.LayerNormalization(epsilon=1e-6),
            ),
        ]
        name, build = options[rng.integers(len(options))]
        return name, build()

    for _ in range(rng.integers(2, 6)):
        kind = rng.choice(["norm", "norm", "attention", "ffn", "dense", "residual"])
        if kind == "norm":
            name, layer = norm()
            x = layer(x)
        elif kind == "attention":
            heads = int(rng.choice([1, 2]))
            key_dim = int(rng.choice([4, 8]))
            y = L.MultiHeadAttention(num_heads=heads, key_dim=key_dim)(x, x)
            x = x + y if rng.random() < 0.7 else y
            name = f"MultiHeadAttention({heads}x{key_dim})"
        elif kind == "ffn":
            width = int(rng.choice([4, 8]))
            y = L.Conv1D(width, 1, activation="relu")(x)
            y = L.Conv1D(channels, 1)(y)
            x = x + y
            name = f"Conv1D({width})->Conv1D({channels}) + residual"
        elif kind == "dense":
            x = L.Dense(channels, activation=rng.choice(["relu", "gelu", None]))(x)
            name = "Dense"
        else:
            name, layer = norm()
            x = x + L.Dense(channels)(layer(x))
            name = f"residual({name} -> Dense)"
        pieces.append(name)
    pool = L.GlobalMaxPooling1D if rng.random() < 0.3 else L.GlobalAveragePooling1D
    x = pool()(x)
    pieces.append(pool.__name__)
    outputs = L.Dense(3)(L.Dense(8, activation="relu")(x))
    model = keras.Model(inputs, outputs)
    _trained_like(model, rng)
    return model, data, " / ".join(pieces)


def _trained_like(model, rng):
    """Weights as a few training steps leave them, without the seconds a
    `fit` spends tracing: every norm's gain drawn in [0.5, 1.5] (a few of
    either sign) and its offset around 0, every other weight perturbed."""
    for layer in model.layers:
        for weight in layer.weights:
            value = weight.numpy()
            name = weight.path.split("/")[-1]
            if name in ("gamma", "scale"):
                value = rng.uniform(0.5, 1.5, value.shape)
                value *= np.where(rng.random(value.shape) < 0.1, -1, 1)
            elif name in ("beta", "offset", "center"):
                value = rng.normal(0, 0.1, value.shape)
            else:
                value = value + rng.normal(0, 0.02, value.shape)
            weight.assign(value.astype(weight.dtype))
