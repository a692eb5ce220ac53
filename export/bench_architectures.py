"""BatchNorm folding and export on real architectures, one table row each.

    python -m export.bench_architectures                  # every model below
    python -m export.bench_architectures --quick          # fewer rounds/samples
    python -m export.bench_architectures --models ResNet50,ConvNeXtTiny

Every model is a `keras.applications` architecture with `weights=None` at
96x96 (logits, no softmax), every BatchNormalization given random moving
mean/variance, gamma and beta (so that a folding mistake shows in the
output) and every `keras.layers.Normalization` given ImageNet statistics with
`finalize_state()` re-run, as loading pretrained weights does. Per model it
prints: BN count, folded, kept (reasons summarized below the table), the max
relative error of the folded Keras model, SavedModel batch-1 latency
unfolded vs folded (medians of interleaved calls, and their ratio), and
TFLite float32 and int8 size and parity (max |tflite - keras| / max |keras|).
A failing step is reported in its cell and the run goes on.
"""

import argparse
import collections
import datetime
import gc
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from benchmarks import machine
from kerasnorm.export import fold_batchnorm
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite

SIZE = 96
APPS = keras.applications


def _app(cls, **kwargs):
    def build():
        return cls(
            weights=None,
            input_shape=(SIZE, SIZE, 3),
            classifier_activation=None,
            **kwargs,
        )

    return build


def _wrapped_backbone():
    """A Functional model with a backbone as a nested sub-model and a BN head."""
    backbone = APPS.MobileNetV2(
        weights=None, input_shape=(SIZE, SIZE, 3), include_top=False, alpha=0.35
    )
    image = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.GlobalAveragePooling2D()(backbone(image))
    x = keras.layers.Dense(64, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    return keras.Model(image, keras.layers.Dense(10)(x), name="wrapped_mobilenetv2")


ARCHITECTURES = {
    "ResNet50": _app(APPS.ResNet50),
    "ResNet50V2": _app(APPS.ResNet50V2),
    "MobileNetV2": _app(APPS.MobileNetV2),
    "MobileNetV3Small": _app(APPS.MobileNetV3Small),
    "EfficientNetB0": _app(APPS.EfficientNetB0),
    "EfficientNetV2B0": _app(APPS.EfficientNetV2B0),
    "DenseNet121": _app(APPS.DenseNet121),
    "Xception": _app(APPS.Xception),
    "InceptionV3": _app(APPS.InceptionV3),
    # NASNet's own minimum is 32x32; 96x96 builds and runs like the others.
    "NASNetMobile": _app(APPS.NASNetMobile),
    "ConvNeXtTiny": _app(APPS.ConvNeXtTiny),
    "Wrapped(MobileNetV2)": _wrapped_backbone,
}


def _layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def randomize_statistics(model, seed=0):
    """Random BN statistics and affine; ImageNet statistics in Normalization."""
    rng = np.random.default_rng(seed)
    bns = 0
    for layer in _layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            bns += 1
            n = layer.moving_mean.shape
            layer.moving_mean.assign(rng.normal(0.0, 0.5, n))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n))
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n))
            if layer.center:
                layer.beta.assign(rng.normal(0.0, 0.3, n))
        elif isinstance(layer, keras.layers.Normalization) and hasattr(
            layer, "adapt_mean"
        ):
            # What loading an adapted layer's weights does: assign the
            # statistics, then derive the tensors `call` uses.
            layer.adapt_mean.assign([0.485, 0.456, 0.406])
            layer.adapt_variance.assign(np.square([0.229, 0.224, 0.225]))
            layer.finalize_state()
    return bns


def _error(err):
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text[:160] + ("..." if len(text) > 160 else "")


def _relative(want, got):
    want, got = np.asarray(want), np.asarray(got)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


def _reason_kind(reason):
    """A kept-BN reason without the layer names, to count alike reasons."""
    return re.sub(r"'[^']*'", "X", reason)


def _saved_model_latency(paths, inputs, rounds):
    """Batch-1 medians in ms, calls interleaved (rotating order) per round."""
    import tensorflow as tf

    functions = [tf.saved_model.load(p).signatures["serving_default"] for p in paths]
    feeds = []
    for fn in functions:
        (name,) = fn.structured_input_signature[1]
        feeds.append({name: tf.constant(inputs[:1])})
    for fn, feed in zip(functions, feeds, strict=True):
        fn(**feed)  # warm up
    times = [[] for _ in functions]
    for r in range(rounds):
        order = list(range(len(functions)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            start = time.perf_counter()
            functions[i](**feeds[i])
            times[i].append(time.perf_counter() - start)
    return [1000 * statistics.median(t) for t in times]


def run_one(name, build, args, workdir):
    row = {"model": name}
    keras.utils.set_random_seed(0)
    model = build()
    row["bn"] = randomize_statistics(model)
    rng = np.random.default_rng(1)
    data = rng.uniform(-1.0, 1.0, (args.samples, SIZE, SIZE, 3)).astype("float32")
    try:
        folded, report = fold_batchnorm(model, return_report=True)
        row["folded"], row["kept"] = len(report.folded), len(report.kept)
        row["reasons"] = collections.Counter(
            _reason_kind(k.reason) for k in report.kept
        )
        want = model.predict(data, verbose=0, batch_size=8)
        got = folded.predict(data, verbose=0, batch_size=8)
        row["fold_err"] = f"{_relative(want, got):.1e}"
    except Exception as err:
        row["fold_err"] = f"error: {_error(err)}"
    check = data[: args.verify]
    try:
        paths = []
        for fold in (False, True):
            base = os.path.join(workdir, f"sm_{int(fold)}")
            result = to_saved_model(
                model, base, fold=fold, version=1, verify_inputs=check
            )
            paths.append(result.path)
        plain, fast = _saved_model_latency(paths, data, args.rounds)
        row["sm"] = f"{plain:.2f} / {fast:.2f} ({plain / fast:.2f}x)"
    except Exception as err:
        row["sm"] = f"error: {_error(err)}"
    for mode in (None, "int8"):
        key = mode or "float32"
        try:
            result = to_tflite(
                model,
                os.path.join(workdir, f"{key}.tflite"),
                quantize=mode,
                representative_data=data if mode else None,
                calibration_samples=args.samples,
                verify_inputs=check,
                tolerance=float("inf"),  # report parity here, do not gate on it
            )
            size = result.size_bytes / 2**20
            row[key] = f"{size:.2f} MiB, {result.verification.max_rel_error:.1e}"
        except Exception as err:
            row[key] = f"error: {_error(err)}"
    return row


COLUMNS = (
    ("model", "model"),
    ("bn", "BN"),
    ("folded", "folded"),
    ("kept", "kept"),
    ("fold_err", "folded max rel err"),
    ("sm", "SavedModel ms, unfolded / folded"),
    ("float32", "TFLite float32 (size, rel err)"),
    ("int8", "TFLite int8 (size, rel err)"),
)


def print_table(rows):
    print("| " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row.get(key, "-")) for key, _ in COLUMNS) + " |")
    print()
    for row in rows:
        for reason, count in sorted(row.get("reasons", {}).items()):
            print(f"- {row['model']}: {count} kept: {reason}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", help="comma-separated subset of: " + ", ".join(ARCHITECTURES)
    )
    parser.add_argument(
        "--quick", action="store_true", help="10 latency rounds, 8 samples"
    )
    args = parser.parse_args(argv)
    names = list(ARCHITECTURES)
    if args.models:
        names = [n.strip() for n in args.models.split(",")]
        unknown = [n for n in names if n not in ARCHITECTURES]
        if unknown:
            parser.error(
                f"unknown model(s) {unknown}; choose from {list(ARCHITECTURES)}"
            )
    args.rounds, args.samples, args.verify = (10, 8, 4) if args.quick else (50, 32, 16)
    print(
        f"# {datetime.date.today()}, keras {keras.__version__}, {SIZE}x{SIZE}, "
        f"{args.rounds} latency rounds, {args.samples} calibration samples, "
        f"{args.verify} parity samples"
    )
    print(machine.header())
    rows = []
    for name in names:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(run_one(name, ARCHITECTURES[name], args, workdir))
        print(f"{name}: {rows[-1]} ({time.perf_counter() - start:.0f} s)", flush=True)
        keras.backend.clear_session()
        gc.collect()
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
