"""Part 1 of bench_ondevice.py: kerasnorm's `to_tflite` beside Keras' own
LiteRT export, one row per `Pair` of `pairs()`.

To add a row, add a `Pair` to the list in `pairs()`: a name, a builder of
the model `to_tflite` exports, its inputs, and (for a comparison with Keras'
own layers) `keras_build`, a builder of the twin that Keras' export gets,
e.g.

    Pair(
        "conv + LayerNorm vs Keras' LayerNormalization",
        lambda: models.conv_net(kerasnorm.LayerNorm, size),
        images,
        keras_build=lambda: models.conv_net(
            lambda: keras.layers.LayerNormalization(epsilon=1e-5), size
        ),
    )

The twin gets the first model's weights (`set_weights`, so the two must
hold the same weights in the same order) and each file is compared with
its own Keras model.
"""

import dataclasses
import os
from collections.abc import Callable

import keras
import numpy as np

import kerasnorm
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import files
from export import models
from export.data import uniform_images
from kerasnorm.export import litert

EXPORTERS = ("kerasnorm", "keras")
# Keras' export is given float32 and its documented int8; kerasnorm's the same.
SIDE_BY_SIDE_MODES = (None, "int8")


@dataclasses.dataclass(frozen=True)
class Pair:
    """One row: `build()` makes the model; `data` is `n -> n inputs`, or a
    trained model's `(training inputs, held-out inputs)` (calibration from
    the first, the check from the second); `keras_build()`, if given, the
    twin Keras' export gets in its place; `dynamic`: kerasnorm's float32
    file keeps a dynamic batch (`to_tflite`'s default), as Keras' export
    writes its own, where the other rows time a batch-1 file; `quick`: part
    of `--quick`."""

    name: str
    build: Callable[[], keras.Model]
    data: Callable[[int], np.ndarray] | tuple
    keras_build: Callable[[], keras.Model] | None = None
    dynamic: bool = False
    quick: bool = False

    def models(self):
        """`(model, the model Keras' export gets)`: `build()`'s model and its
        twin with the same weights, or the model itself without a twin."""
        model = self.build()
        if self.keras_build is None:
            return model, model
        twin = self.keras_build()
        twin.set_weights(model.get_weights())
        return model, twin


def pairs(quick, trained):
    """The rows, in table order. `trained`: `{label: (model, x_train,
    x_test)}` of the recurrent models part 2 trained; the digits ones join."""
    size = 16 if quick else 32
    steps, width = (8, 16) if quick else (32, 64)
    rng = np.random.default_rng(1)

    def images(n, side=size):
        return uniform_images(rng, n, side)

    def tokens(n):
        return rng.standard_normal((n, steps, width)).astype("float32")

    rows = [
        Pair(
            "conv + GroupNorm",
            lambda: models.conv_net(lambda: kerasnorm.GroupNorm(groups=4), size),
            images,
            quick=True,
        ),
        Pair(
            "conv + LayerNorm",
            lambda: models.conv_net(kerasnorm.LayerNorm, size),
            images,
        ),
        Pair(
            "MobileNetV3Small 96x96",
            models.mobilenet_v3_small,
            lambda n: images(n, 96),
        ),
        Pair(
            "DeepNorm encoder",
            lambda: models.encoder("deepnorm", steps, width, 1 if quick else 2),
            tokens,
        ),
    ]
    rows += _twin_pairs(size, steps, width, images, tokens)
    for name, (model, x_train, x_test) in trained.items():
        if "digits" in name:
            rows.append(Pair(name, lambda m=model: m, (x_train, x_test), quick=True))
    return [row for row in rows if row.quick or not quick]


def _twin_pairs(size, steps, width, images, tokens):
    """kerasnorm's norms against Keras' own, each model through its own
    exporter at its default dynamic batch (docs/norm_speed.md, float32
    files), timed at batch 1. The norms' weights are
    random (`randomize_norms`), as trained ones are: the converter folds a
    gain of ones and an offset of zeros away."""
    return _twins(
        (
            ("conv", lambda norm: models.conv_net(norm, size), images, tuple(NORMS)),
            (
                "token MLP",
                lambda norm: models.token_mlp(norm, steps, width),
                tokens,
                ("LayerNorm", "RMSNorm"),
            ),
        )
    )


def wide_twin_pairs():
    """The twin rows at the width where the convolutions and matmuls
    outweigh the norms: `models.wide_conv_net` (three Conv2D(64, 3) on 32 x
    32 x 16) and four residual token MLP blocks of 64 tokens x 128."""
    rng = np.random.default_rng(1)

    def features(n):
        return rng.uniform(-1, 1, (n, 32, 32, 16)).astype("float32")

    def tokens(n):
        return rng.standard_normal((n, 64, 128)).astype("float32")

    return _twins(
        (
            ("wide conv", models.wide_conv_net, features, tuple(NORMS)),
            (
                "4-block token MLP 64x128",
                lambda norm: models.token_mlp(norm, 64, 128, blocks=4),
                tokens,
                ("LayerNorm", "RMSNorm"),
            ),
        )
    )


# name -> (kerasnorm's layer, Keras' layer) factories of the twin rows.
NORMS = {
    "LayerNorm": (
        kerasnorm.LayerNorm,
        lambda: keras.layers.LayerNormalization(epsilon=1e-5),
    ),
    "RMSNorm": (
        kerasnorm.RMSNorm,
        lambda: keras.layers.RMSNormalization(epsilon=1e-6),
    ),
    "GroupNorm": (
        lambda: kerasnorm.GroupNorm(groups=4),
        lambda: keras.layers.GroupNormalization(4, epsilon=1e-5),
    ),
}


def _twins(nets):
    """A `Pair` per net and norm name: `nets` holds `(net name, builder of
    the net from a norm factory, data, norm names)`."""
    rows = []
    for net, build, data, names in nets:
        for name in names:
            ours, theirs = NORMS[name]
            rows.append(
                Pair(
                    f"{net} + {name} vs Keras {type(theirs()).__name__}",
                    lambda build=build, ours=ours: _randomized(build(ours)),
                    data,
                    keras_build=lambda build=build, theirs=theirs: build(theirs),
                    dynamic=True,
                )
            )
    return rows


def _randomized(model):
    models.randomize_norms(model)
    return model


def _for_int8(model):
    """TFLite's int8 calibration crashes on a rolled loop: both exporters
    get a recurrent model rebuilt with `unroll=True`."""
    if any(hasattr(layer, "cell") for layer in model.layers):
        return models.unrolled_copy(model)
    return model


def _file_cell(content, seconds):
    ops = litert.op_counts(content)
    return {
        "convert_s": round(seconds, 2),
        "size_kib": round(len(content) / 1024, 1),
        "ops": sum(ops.values()),
        "op_counts": ops,
        "flex": sorted(op for op in ops if op.startswith("Flex")),
    }


def side_by_side(pair, args, workdir):
    """The row of `pair`: per exporter and mode, the file's ops, size,
    converter time, error against its Keras model and latency (`ms`); a
    failed export or run is recorded in its cell (`error`, `run_error`)."""
    keras.utils.set_random_seed(0)
    model, twin = pair.models()
    if isinstance(pair.data, tuple):  # trained: calibrate on training inputs
        calibration = pair.data[0][: args.calibration]
        check = pair.data[1][: args.check]
    else:
        calibration, check = pair.data(args.calibration), pair.data(args.check)
    row = {"model": pair.name, "params": model.count_params()}
    row["keras model"] = "same" if twin is model else "Keras layers"
    runners = {}
    for exporter, source in zip(EXPORTERS, (model, twin), strict=True):
        want = source.predict(check, verbose=0, batch_size=32)
        for mode in SIDE_BY_SIDE_MODES:
            key = f"{exporter} {mode or 'float32'}"
            path = os.path.join(workdir, key.replace(" ", "_") + ".tflite")
            exported = _for_int8(source) if mode else source
            try:
                if exporter == "kerasnorm":
                    batch = None if pair.dynamic and mode is None else 1
                    _, content, seconds = files.kerasnorm_export(
                        exported, path, mode, calibration, check, batch_size=batch
                    )
                else:
                    content, seconds = files.keras_export(
                        exported, path, mode, calibration
                    )
                cell = _file_cell(content, seconds)
            except Exception as err:
                row[key] = {"error": files.error_text(err)}
                continue
            try:
                run = files.runner(content)
                cell.update(files.errors(want, files.first_output(run, check)))
                runners[key] = run
            except Exception as err:
                cell["run_error"] = files.error_text(err)
            row[key] = cell
    timers = {key: burst_timer(run, check[:1]) for key, run in runners.items()}
    for key, seconds in interleaved_medians(timers, args.repeats).items():
        row[key]["ms"] = 1e3 * seconds
    return row


def op_differences(row, mode):
    """Per op, (kerasnorm count, keras count) where the two files differ."""
    mine = row[f"kerasnorm {mode}"].get("op_counts")
    theirs = row[f"keras {mode}"].get("op_counts")
    if mine is None or theirs is None:
        return {}
    return {
        op: (mine.get(op, 0), theirs.get(op, 0))
        for op in sorted(set(mine) | set(theirs))
        if mine.get(op, 0) != theirs.get(op, 0)
    }
