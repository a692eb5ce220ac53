"""On device: kerasnorm's `to_tflite` beside Keras' own LiteRT export, and the
recurrent layers in every quantize mode.

    python -m export.bench_ondevice                     # everything, ~15 min
    python -m export.bench_ondevice --quick             # tiny: a smoke test
    python -m export.bench_ondevice --repeats 50 --out /tmp/ondevice

Part 1, side by side. Per model (a small conv net with GroupNorm, one with
LayerNorm, MobileNetV3Small at 96x96 with random BatchNorm statistics as in
bench_architectures.py, a DeepNorm encoder of kerasnorm's blocks, and a
LayerNormLSTM and a LayerNormGRU trained on the 8 rows of scikit-learn's
digits), kerasnorm's `to_tflite` against `model.export(path,
format="litert")`, the path Keras documents: whether the file has only
builtin ops (else the Flex ops it needs), op count, size, LiteRT latency at
batch 1 (XNNPACK, one thread), max |file - keras| / max |keras| on held-out
inputs, and the same for int8 (rms error over the logits' rms instead). For
int8 Keras' export gets what its docs say to pass, `optimizations` and a
`representative_dataset` (int8 with float fallback); a recurrent model is
given to both exporters rebuilt with `unroll=True`, since TFLite's int8
calibration crashes on a rolled loop. A failed export is recorded in its
cell and the run goes on. The ops in which the two files differ are listed
below the table: that is where a latency difference comes from.

Part 2, recurrent layers in every quantize mode. A LayerNormLSTM and a
LayerNormGRU trained on two tasks: the digits' 8 rows (8 steps of 8, 10
classes) and the sign of a running sum (64 steps of 2 features, the second
noise; generated from a seeded generator), each in float32, float16,
dynamic, int8 and int16x8: test accuracy, rms of (file - keras logits) over
the rms of the keras logits, size, converter time and LiteRT latency.
int8 and int16x8 use the rolled model where `to_tflite` unrolls it itself,
else a copy built with `unroll=True` by hand (said in the table); int16x8 is
"not available" where `kerasnorm.export.QUANTIZE_MODES` lacks it.

Parts 3 and 4 (export/ondevice_int8.py, which says how): int8 against
float32 per norm at the issue-28 sizes, the full-integer file
(`int8_io=True`, what `quantize="int8"` wrote before issue 28) and the fast
one `quantize="int8"` writes now (norm statistics, batched matmuls, softmax
and GELU in float), with XNNPACK partitions; parts 1 and 2's "int8" is that
fast file too; and a streaming LayerNormLSTM's int8 error against sequence
length (8, 28, 64, 128 steps) per mode, with the float-state int8 step.
Their latency is thread CPU time, robust on a shared machine.

Latency: every candidate of one table (both exporters, float32 and int8; or
the five modes) is timed in the same rounds, one measurement each per round
in a rotating order (benchmarks/timing.py), each measurement a burst of calls
long enough (~5 ms) for the timer; the figures are medians over `--repeats`
rounds. The machines these ran on are shared: compare the ratios.
"""

import argparse
import datetime
import gc
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import kerasnorm
from benchmarks import machine
from benchmarks.timing import interleaved_medians
from export import ondevice_int8
from export.bench_architectures import randomize_statistics
from kerasnorm.cli.demo import load_digits
from kerasnorm.export import QUANTIZE_MODES
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.convert import stderr_captured

L = keras.layers
MODES = (None, "float16", "dynamic", "int8", "int16x8")
# One latency measurement is a burst of calls at least this long, so that
# the timer's resolution and the call overhead do not dominate a 0.1 ms model.
BURST_SECONDS = 0.005


# Models -------------------------------------------------------------------


def conv_net(norm, size):
    inputs = keras.Input((size, size, 3), name="image")
    x = L.Conv2D(16, 3, padding="same")(inputs)
    x = L.ReLU()(norm()(x))
    x = L.Conv2D(32, 3, strides=2, padding="same")(x)
    x = L.ReLU()(norm()(x))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def deepnorm_encoder(steps, width, layers):
    inputs = keras.Input((steps, width), name="tokens")
    x = inputs
    for _ in range(layers):
        x = kerasnorm.TransformerEncoderBlock(
            num_heads=4,
            key_dim=width // 4,
            intermediate_dim=2 * width,
            norm_position="deepnorm",
            num_layers=layers,
        )(x)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(10)(x))


def recurrent(cls, units, steps, features, classes, unroll=False):
    inputs = keras.Input((steps, features), name="sequence")
    x = cls(units, unroll=unroll)(inputs)
    return keras.Model(inputs, L.Dense(classes)(x))


def unrolled_copy(model):
    """The model with every recurrent layer built with `unroll=True`, same
    weights: what a user does by hand for int8 today."""
    layer = next(x for x in model.layers if hasattr(x, "cell"))
    steps, features = model.inputs[0].shape[1:]
    classes = model.outputs[0].shape[-1]
    copy = recurrent(type(layer), layer.units, steps, features, classes, True)
    copy.set_weights(model.get_weights())
    return copy


# Data ---------------------------------------------------------------------


def digits_rows(seed=0):
    """The digits as 8 steps (rows) of 8 features, as the demo trains them."""
    x_train, y_train, x_test, y_test = load_digits(seed)
    return x_train[..., 0], y_train, x_test[..., 0], y_test


def running_sum(n_train, n_test, steps, seed=0):
    """Is the sum of feature 0 over all `steps` positive? Feature 1 is noise
    the model has to ignore; the answer needs the whole sequence."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_train + n_test, steps, 2)).astype("float32")
    y = (x[..., 0].sum(axis=1) > 0).astype("int32")
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def train(model, x, y, epochs):
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)
    return model


# Files --------------------------------------------------------------------


class LiteFile:
    """A `.tflite` file's only signature in LiteRT's interpreter on one
    thread (XNNPACK applied, as by default), batch 1, float in and out
    (quantized inputs and outputs converted by their scale and zero point).
    A file with Flex ops does not run here: LiteRT's Python package (and
    TensorFlow's deprecated `tf.lite.Interpreter`) has no Flex delegate."""

    def __init__(self, content):
        from ai_edge_litert.interpreter import Interpreter

        with stderr_captured(True):
            interp = Interpreter(model_content=content, num_threads=1)
        self._runner = interp.get_signature_runner()
        ((self._name, self._input),) = self._runner.get_input_details().items()
        outputs = self._runner.get_output_details()
        self._output_name = sorted(outputs)[0]
        self._output = outputs[self._output_name]

    def __call__(self, x):
        """Logits for one sample `x` of batch 1."""
        feed = _quantize(np.asarray(x, np.float32), self._input)
        out = self._runner(**{self._name: feed})[self._output_name]
        return _dequantize(out, self._output)

    def predict(self, x):
        return np.concatenate([self(x[i : i + 1]) for i in range(len(x))])

    def burst(self, x):
        """A zero-argument timer: seconds per call over a burst of calls."""
        self(x)
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < BURST_SECONDS:
            self(x)
            calls += 1
        n = max(calls, 1)

        def measure():
            start = time.perf_counter()
            for _ in range(n):
                self(x)
            return (time.perf_counter() - start) / n

        return measure


def _quantize(value, detail):
    if np.issubdtype(detail["dtype"], np.integer):
        scale, zero_point = detail["quantization"]
        info = np.iinfo(detail["dtype"])
        value = np.clip(np.round(value / scale + zero_point), info.min, info.max)
    return value.astype(detail["dtype"])


def _dequantize(value, detail):
    if np.issubdtype(detail["dtype"], np.integer):
        scale, zero_point = detail["quantization"]
        return (value.astype(np.float32) - zero_point) * scale
    return value


def max_rel(want, got):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def rms_rel(want, got):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


def _error(err):
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text[:200] + ("..." if len(text) > 200 else "")


def kerasnorm_export(model, path, mode, calibration, check):
    start = time.perf_counter()
    to_tflite(
        model,
        path,
        quantize=mode,
        representative_data=calibration,
        calibration_samples=len(calibration),
        verify_inputs=check,
        tolerance=float("inf"),  # measured here, not gated on
        overwrite=True,
    )
    seconds = time.perf_counter() - start
    with open(path, "rb") as f:
        return f.read(), seconds


def keras_export(model, path, mode, calibration):
    kwargs = {}
    if mode == "int8":
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
        kwargs["representative_dataset"] = lambda: (
            [calibration[i : i + 1]] for i in range(len(calibration))
        )
    start = time.perf_counter()
    with stderr_captured(True):
        model.export(path, format="litert", verbose=False, **kwargs)
    seconds = time.perf_counter() - start
    with open(path, "rb") as f:
        return f.read(), seconds


# Part 1: side by side -----------------------------------------------------


def side_by_side_models(args, trained):
    size = 16 if args.quick else 32
    rng = np.random.default_rng(1)

    def images(n, side):
        return rng.uniform(-1, 1, (n, side, side, 3)).astype("float32")

    def mobilenet():
        model = keras.applications.MobileNetV3Small(
            weights=None, input_shape=(96, 96, 3), classifier_activation=None
        )
        randomize_statistics(model)
        return model

    steps, width = (8, 16) if args.quick else (32, 64)
    models = {
        "conv + GroupNorm": (
            lambda: conv_net(lambda: kerasnorm.GroupNorm(groups=4), size),
            lambda n: images(n, size),
        ),
        "conv + LayerNorm": (
            lambda: conv_net(kerasnorm.LayerNorm, size),
            lambda n: images(n, size),
        ),
        "MobileNetV3Small 96x96": (mobilenet, lambda n: images(n, 96)),
        "DeepNorm encoder": (
            lambda: deepnorm_encoder(steps, width, 1 if args.quick else 2),
            lambda n: rng.standard_normal((n, steps, width)).astype("float32"),
        ),
    }
    for name, (model, x_train, x_test) in trained.items():
        if "digits" in name:
            models[name] = (lambda m=model: m, (x_train, x_test))
    return models


def side_by_side(name, build, data, args, workdir):
    keras.utils.set_random_seed(0)
    model = build()
    int8_model = model
    if any(hasattr(layer, "cell") for layer in model.layers):
        int8_model = unrolled_copy(model)
    if isinstance(data, tuple):  # trained: calibrate on training inputs
        calibration, check = data[0][: args.calibration], data[1][: args.check]
    else:
        calibration, check = data(args.calibration), data(args.check)
    want = model.predict(check, verbose=0, batch_size=32)
    row = {"model": name, "params": model.count_params()}
    files = {}
    for exporter in ("kerasnorm", "keras"):
        for mode in (None, "int8"):
            key = f"{exporter} {mode or 'float32'}"
            path = os.path.join(workdir, key.replace(" ", "_") + ".tflite")
            source = int8_model if mode else model
            cell = {}
            try:
                if exporter == "kerasnorm":
                    content, seconds = kerasnorm_export(
                        source, path, mode, calibration, check
                    )
                else:
                    content, seconds = keras_export(source, path, mode, calibration)
                ops = litert.op_counts(content)
                cell.update(
                    convert_s=round(seconds, 2),
                    size_kib=round(len(content) / 1024, 1),
                    ops=sum(ops.values()),
                    op_counts=ops,
                    flex=sorted(op for op in ops if op.startswith("Flex")),
                )
            except Exception as err:
                cell["error"] = _error(err)
                row[key] = cell
                continue
            try:
                file = LiteFile(content)
                got = file.predict(check)
                cell.update(max_rel=max_rel(want, got), rms_rel=rms_rel(want, got))
                files[key] = file
            except Exception as err:
                cell["run_error"] = _error(err)
            row[key] = cell
    timers = {key: file.burst(check[:1]) for key, file in files.items()}
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


# Part 2: recurrent layers in every quantize mode --------------------------


def tasks(args):
    """{name: (data, units, epochs)}, data `(x_train, y_train, x_test,
    y_test)`; with `--quick` a few samples, 8 steps, 8 units, one epoch."""
    digits = digits_rows()
    if args.quick:
        digits = (digits[0][:128], digits[1][:128], digits[2][:64], digits[3][:64])
        return {
            "digits rows (8x8)": (digits, 8, 1),
            "running sum (8x2)": (running_sum(128, 64, 8), 8, 1),
        }
    # 32 units for 64 steps: converting the unrolled int8 file takes about
    # as long per step as per unit.
    return {
        "digits rows (8x8)": (digits, 64, 15),
        "running sum (64x2)": (running_sum(1024, 512, 64), 32, 10),
    }


CELLS = (kerasnorm.LayerNormLSTM, kerasnorm.LayerNormGRU)


def train_recurrent(args):
    """{label: (trained model, x_train, y_train, x_test, y_test)}."""
    trained = {}
    for number, (task, (data, units, epochs)) in enumerate(tasks(args).items()):
        x_train, y_train, x_test, y_test = data
        # --quick trains one cell per task: each cell and each task once.
        cells = CELLS[number % 2 :][:1] if args.quick else CELLS
        for cls in cells:
            keras.utils.set_random_seed(0)
            steps, features = x_train.shape[1:]
            model = recurrent(cls, units, steps, features, int(y_train.max()) + 1)
            start = time.perf_counter()
            train(model, x_train, y_train, epochs)
            label = f"{cls.__name__}({units}), {task}"
            print(
                f"trained {label} for {epochs} epochs in "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
            trained[label] = (model, x_train, y_train, x_test, y_test)
    return trained


def every_mode(label, model, x_train, x_test, y_test, args, workdir):
    want = model.predict(x_test, verbose=0, batch_size=64)
    rows = {"float": {"accuracy": float(np.mean(want.argmax(-1) == y_test))}}
    files = {}
    calibration = x_train[: args.calibration]
    for mode in MODES:
        key = mode or "float32"
        cell = {}
        rows[key] = cell
        if mode not in QUANTIZE_MODES:
            cell["error"] = "not available (not in kerasnorm.export.QUANTIZE_MODES)"
            continue
        path = os.path.join(workdir, f"{key}.tflite")
        source = model
        try:
            try:
                content, seconds = kerasnorm_export(
                    source, path, mode, calibration, x_test[: args.check]
                )
                cell["unrolled"] = (
                    "no" if mode in (None, "float16", "dynamic") else ("by to_tflite")
                )
            except ValueError as err:
                if "unroll" not in str(err):
                    raise
                source = unrolled_copy(model)
                content, seconds = kerasnorm_export(
                    source, path, mode, calibration, x_test[: args.check]
                )
                cell["unrolled"] = "by hand"
            file = LiteFile(content)
            got = file.predict(x_test)
            cell.update(
                accuracy=float(np.mean(got.argmax(-1) == y_test)),
                rms_rel=rms_rel(want, got),
                size_kib=round(len(content) / 1024, 1),
                ops=sum(litert.op_counts(content).values()),
                convert_s=round(seconds, 1),
            )
            files[key] = file
        except Exception as err:
            cell["error"] = _error(err)
    timers = {key: file.burst(x_test[:1]) for key, file in files.items()}
    for key, seconds in interleaved_medians(timers, args.repeats).items():
        rows[key]["ms"] = 1e3 * seconds
    return {"model": label, **rows}


# Tables -------------------------------------------------------------------


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _parity(cell, key):
    if "run_error" in cell:
        return "does not run"
    return f"{cell[key]:.1e}" if key == "max_rel" else f"{cell[key]:.3f}"


def side_by_side_table(rows):
    lines = [
        "| model | exporter | builtin only | ops | size KiB | float32 ms | "
        "max rel err | int8 builtin only | int8 ms | int8 rms err | "
        "int8 / float32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        for exporter in ("kerasnorm", "keras"):
            cells = []
            for mode in ("float32", "int8"):
                cell = row[f"{exporter} {mode}"]
                if "error" in cell:
                    notes.append(f"{row['model']}, {exporter} {mode}: {cell['error']}")
                    cells.append(["export failed", "-", "-", "-", "-"])
                    continue
                if "run_error" in cell:
                    notes.append(
                        f"{row['model']}, {exporter} {mode} does not run in "
                        f"LiteRT: {cell['run_error']}"
                    )
                flex = cell["flex"]
                cells.append(
                    [
                        "yes" if not flex else "no: " + ", ".join(flex),
                        str(cell["ops"]),
                        f"{cell['size_kib']:.1f}",
                        _fmt(cell.get("ms"), ".3f"),
                        _parity(cell, "max_rel" if mode == "float32" else "rms_rel"),
                    ]
                )
            f32, i8 = row[f"{exporter} float32"], row[f"{exporter} int8"]
            ratio = i8["ms"] / f32["ms"] if "ms" in i8 and "ms" in f32 else None
            (builtin, ops, size, ms, err), (i8_builtin, _, _, i8_ms, i8_err) = cells
            lines.append(
                f"| {row['model']} | {exporter} | {builtin} | {ops} | {size} | {ms} | "
                f"{err} | {i8_builtin} | {i8_ms} | {i8_err} | {_fmt(ratio, '.2f')} |"
            )
    lines.append("")
    for row in rows:
        for mode in ("float32", "int8"):
            diff = op_differences(row, mode)
            if diff:
                text = ", ".join(f"{op} {a} vs {b}" for op, (a, b) in diff.items())
                notes.append(
                    f"{row['model']}, {mode} ops differing (kerasnorm vs keras): "
                    + text
                )
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def modes_table(rows):
    lines = [
        "| model | mode | unrolled | accuracy | rms err | size KiB | ops | "
        "convert s | ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        lines.append(
            f"| {row['model']} | Keras | - | {row['float']['accuracy']:.4f} | - | "
            "- | - | - | - |"
        )
        for mode in MODES:
            cell = row[mode or "float32"]
            if "error" in cell:
                lines.append(
                    f"| {row['model']} | {mode or 'float32'} | - | - | - | - | - | - "
                    "| - |"
                )
                notes.append(f"{row['model']}, {mode}: {cell['error']}")
                continue
            lines.append(
                f"| {row['model']} | {mode or 'float32'} | {cell['unrolled']} | "
                f"{cell['accuracy']:.4f} | {cell['rms_rel']:.4f} | "
                f"{cell['size_kib']:.1f} | {cell['ops']} | {cell['convert_s']} | "
                f"{_fmt(cell.get('ms'), '.3f')} |"
            )
    lines.append("")
    for row in rows:
        base = row["float32"].get("accuracy")
        best = [
            (row[m].get("accuracy"), m)
            for m in ("int8", "int16x8")
            if "error" not in row[m]
        ]
        if base is None or not best:
            continue
        acc, mode = max(best)
        delta = 100 * (acc - base)
        verdict = "met" if delta >= -1 else "NOT met"
        notes.append(
            f"{row['model']}: best integer mode {mode} {delta:+.2f} points against "
            f"float32 (target within 1 point: {verdict})"
        )
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny: a smoke test")
    parser.add_argument(
        "--repeats", type=int, help="latency rounds (default 100, 3 with --quick)"
    )
    parser.add_argument("--out", help="folder for bench_ondevice.json and .md")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 100
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1. Received: {args.repeats}")
    args.calibration, args.check = (8, 8) if args.quick else (200, 64)
    header = (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{args.repeats} latency rounds, batch 1, one thread\n{machine.header()}"
    )
    print(header, flush=True)
    start = time.perf_counter()
    trained = train_recurrent(args)
    with tempfile.TemporaryDirectory() as workdir:
        modes = []
        for label, (model, x_train, _, x_test, y_test) in trained.items():
            modes.append(
                every_mode(label, model, x_train, x_test, y_test, args, workdir)
            )
            print(f"{label}: {modes[-1]}", flush=True)
        sides = []
        models = side_by_side_models(
            args, {k: (v[0], v[1], v[3]) for k, v in trained.items()}
        )
        for name, (build, data) in models.items():
            if args.quick and name not in ("conv + GroupNorm", *trained):
                continue
            sides.append(side_by_side(name, build, data, args, workdir))
            print(f"{name}: {sides[-1]}", flush=True)
            keras.backend.clear_session()
            gc.collect()
        fast = []
        for name, build in ondevice_int8.int8_models(args.quick).items():
            fast.append(ondevice_int8.int8_row(name, build, args, workdir, LiteFile))
            print(f"{name}: {fast[-1]}", flush=True)
            keras.backend.clear_session()
            gc.collect()
        streaming = ondevice_int8.streaming_rows(args, digits_rows(), train, workdir)
        print(f"streaming: {streaming}", flush=True)
    markdown = "\n".join(
        [
            f"# On-device benchmark\n\n{header}\n",
            '## kerasnorm `to_tflite` vs Keras `model.export(format="litert")`\n',
            side_by_side_table(sides),
            "\n## Recurrent layers in every quantize mode\n",
            modes_table(modes),
            "\n## int8 against float32 per norm: the full-integer int8 (int8_io) and "
            "the fast int8\n",
            ondevice_int8.int8_table(fast),
            "\n## Streaming int8 against sequence length\n",
            f"{streaming['model']}; rms error of the last step's logits.\n",
            ondevice_int8.streaming_table(streaming),
            f"\n(run took {time.perf_counter() - start:.0f} s)",
        ]
    )
    print()
    print(markdown)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_ondevice.json"), "w") as f:
            json.dump(
                {
                    "header": header,
                    "machine": machine.info(),
                    "side_by_side": sides,
                    "modes": modes,
                    "fast_int8": fast,
                    "streaming_int8": streaming,
                },
                f,
                indent=1,
            )
        with open(os.path.join(args.out, "bench_ondevice.md"), "w") as f:
            f.write(markdown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
