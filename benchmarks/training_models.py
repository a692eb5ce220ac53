"""The training benchmark's models: four families at two sizes, compiled
each way `kerasnorm.training` offers (bench_training.py times them,
profile_training.py traces them)."""

import keras
import numpy as np

import kerasnorm
import kerasnorm.training

FAMILIES = ("mlp", "cnn", "lstm", "deepnorm")


# Per family and size: the batch and the model's widths. "small" steps take
# 10-40 ms here, "medium" 50-250 ms.
SIZES = {
    "small": {
        "mlp": dict(batch=256, features=256, width=512),
        "cnn": dict(batch=32, image=32, filters=((32, 1), (64, 2), (64, 1))),
        "lstm": dict(batch=64, time=50, features=64, units=128),
        "deepnorm": dict(batch=32, time=32, dim=64, heads=4, key_dim=16, ffn=256),
    },
    "medium": {
        "mlp": dict(batch=256, features=512, width=1024),
        "cnn": dict(batch=32, image=64, filters=((32, 1), (64, 2), (128, 2), (128, 1))),
        "lstm": dict(batch=64, time=100, features=128, units=256),
        "deepnorm": dict(batch=32, time=64, dim=128, heads=4, key_dim=32, ffn=512),
    },
}


def build(family, size="small"):
    """A model of `family` and a batch for it, seeded identically."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    L = keras.layers
    s = SIZES[size][family]
    if family == "mlp":
        x = rng.standard_normal((s["batch"], s["features"]))
        body = [L.Input((s["features"],))]
        for _ in range(3):
            body += [L.Dense(s["width"]), kerasnorm.LayerNorm(), L.Activation("gelu")]
    elif family == "cnn":
        x = rng.standard_normal((s["batch"], s["image"], s["image"], 3))
        body = [L.Input((s["image"], s["image"], 3))]
        for filters, stride in s["filters"]:
            body += [
                L.Conv2D(filters, 3, strides=stride, padding="same"),
                kerasnorm.GroupNorm(8),
                L.ReLU(),
            ]
        body.append(L.GlobalAveragePooling2D())
    elif family == "lstm":
        x = rng.standard_normal((s["batch"], s["time"], s["features"]))
        body = [
            L.Input((s["time"], s["features"])),
            kerasnorm.LayerNormLSTM(s["units"]),
        ]
    elif family == "deepnorm":
        x = rng.standard_normal((s["batch"], s["time"], s["dim"]))
        body = [L.Input((s["time"], s["dim"]))]
        body += [
            kerasnorm.TransformerEncoderBlock(
                s["heads"],
                s["key_dim"],
                s["ffn"],
                norm_position="deepnorm",
                num_layers=4,
            )
            for _ in range(4)
        ]
        body.append(L.GlobalAveragePooling1D())
    else:
        raise ValueError(f"Unknown family. Received: family={family!r}")
    model = keras.Sequential([*body, L.Dense(10)])
    y = rng.integers(0, 10, size=(len(x),))
    return model, (x.astype("float32"), y.astype("int32"))


JIT = {"xla": True, "no_xla": False, "norms": "norms", "measure": "measure"}


def compiled(family, kind, size="small"):
    """(model, sample batch) compiled the way `kind` says."""
    policy = "mixed_bfloat16" if kind.startswith("bf16") else "float32"
    keras.config.set_dtype_policy(policy)
    try:
        model, sample = build(family, size)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        optimizer = keras.optimizers.Adam(1e-3)
        if kind == "keras_auto":
            model.compile(optimizer, loss)
        else:
            # Only "measure" gets the sample: the others' first step is timed
            # with its compilation.
            measure = kind == "measure"
            kerasnorm.training.compile(
                model,
                optimizer=optimizer,
                loss=loss,
                jit_compile=JIT[kind.removeprefix("bf16_")],
                sample=sample if measure else None,
            )
    finally:
        keras.config.set_dtype_policy("float32")
    return model, sample
