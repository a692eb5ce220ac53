"""Text transformers on tokens: float32 against the fast int8 file.

    python -m export.bench_int8_tokens            # 4 models, ~10 min
    python -m export.bench_int8_tokens --quick    # one tiny model: a smoke test

Each model is `Embedding(1000, 128)` -> two of kerasnorm's transformer
blocks (4 heads of 32, feed-forward 256) over 64 tokens -> (a final
`LayerNorm` for Pre-LN) -> average pooling (masked where the model has a
`padding_mask` input) -> `Dense(2)`, trained 3 epochs on 2000 generated
sequences to tell whether a key token is among the real positions (the
padded ones hold random tokens, the key among them half the time), tested
on 512 others. Per model: float32 and `to_tflite(quantize="int8")` latency
at batch 1 (LiteRT's CPU delegate XNNPACK, one thread: the Python
interpreter's default), int8 / float32, size, accuracy of Keras, float32
and int8, the int8 file's rms error (its own check, default tolerance 0.1)
and XNNPACK partitions.

What each int8 lever bought (the attention scores, `DIV`, each norm's
normalization kept in float) is measured in docs/design.md §11 and pinned
by `test_each_int8_lever_is_needed` in tests/export/test_tflite_int8_tokens.py:
rebuilding the file lever by lever takes the quantizer's private calls,
which the benchmark scripts do not use (public names only).

Latency is the interpreter thread's CPU time (`time.thread_time`) per call,
bursts of calls >= 10 ms, every candidate of a model timed in the same
interleaved rounds, medians: robust on a shared machine; compare ratios.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import kerasnorm
from benchmarks import machine
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from kerasnorm.export import litert
from kerasnorm.export import output_errors
from kerasnorm.export import to_tflite

L = keras.layers
KEY = 1
# One latency measurement: a burst of calls of at least this much CPU time.
BURST_CPU_SECONDS = 0.01
FULL = dict(vocab=1000, length=64, width=128, layers=2, train=2000, test=512)
QUICK = dict(vocab=64, length=16, width=32, layers=1, train=1024, test=256)
MODELS = (
    ("encoder", "pre", True),
    ("encoder", "pre", False),
    ("encoder", "deepnorm", True),
    ("decoder", "post", True),
)


def tokens(n, masked, size, seed):
    rng = np.random.default_rng(seed)
    length = size["length"]
    x = rng.integers(KEY + 1, size["vocab"], size=(n, length))
    lengths = rng.integers(length // 4, length + 1, n) if masked else np.full(n, length)
    y = rng.integers(0, 2, n)
    for i in range(n):
        if y[i]:
            x[i, rng.integers(0, lengths[i])] = KEY
        if masked and lengths[i] < length and rng.random() < 0.5:
            x[i, rng.integers(lengths[i], length)] = KEY
    x = x.astype("int32")
    if not masked:
        return [x], y
    return [x, (np.arange(length)[None] < lengths[:, None]).astype("int32")], y


def model(kind, position, masked, size):
    ids = keras.Input((size["length"],), dtype="int32", name="tokens")
    inputs, mask = [ids], None
    if masked:
        mask_input = keras.Input((size["length"],), dtype="int32", name="padding_mask")
        inputs.append(mask_input)
        mask = keras.ops.cast(inputs[1], "bool")
    x = L.Embedding(size["vocab"], size["width"])(ids)
    block = (
        kerasnorm.TransformerEncoderBlock
        if kind == "encoder"
        else kerasnorm.TransformerDecoderBlock
    )
    mask_name = "padding_mask" if kind == "encoder" else "decoder_padding_mask"
    for _ in range(size["layers"]):
        x = block(
            num_heads=4,
            key_dim=size["width"] // 4,
            intermediate_dim=2 * size["width"],
            norm_position=position,
            num_layers=size["layers"],
        )(x, **{mask_name: mask})
    if position == "pre":
        x = kerasnorm.LayerNorm()(x)
    x = L.GlobalAveragePooling1D()(x, mask=mask)
    return keras.Model(inputs, L.Dense(2)(x))


def row(kind, position, masked, size, args, workdir):
    keras.utils.set_random_seed(0)
    net = model(kind, position, masked, size)
    net.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = tokens(size["train"], masked, size, 1)
    net.fit(x, y, epochs=args.epochs, batch_size=32, verbose=0)
    calibration, _ = tokens(200, masked, size, 2)
    test, labels = tokens(size["test"], masked, size, 3)
    want = net.predict(test, verbose=0)
    paths = {k: os.path.join(workdir, f"{k}.tflite") for k in ("float32", "int8")}
    results = {}
    results["float32"] = to_tflite(
        net, paths["float32"], overwrite=True, verify_inputs=test, batch_size=1
    )
    results["int8"] = to_tflite(
        net,
        paths["int8"],
        quantize="int8",
        batch_size=1,
        overwrite=True,
        representative_data=calibration,
        verify_inputs=test,
    )
    files = {k: open(p, "rb").read() for k, p in paths.items()}
    out = {"model": f"{kind}, {position}, {'mask' if masked else 'no mask'}"}
    out["keras_accuracy"] = float(np.mean(want.argmax(-1) == labels))
    runners = {k: litert.Runner(c, net) for k, c in files.items()}
    one = [a[:1] for a in test]
    timers = {
        k: burst_timer(r, one, seconds=BURST_CPU_SECONDS, clock=time.thread_time)
        for k, r in runners.items()
    }
    ms = interleaved_medians(timers, args.repeats)
    for k, content in files.items():
        got = runners[k].predict(test)[0]
        report = results[k].verification.delegation
        out[k] = {
            "ms": 1e3 * ms[k],
            "ratio": ms[k] / ms["float32"],
            "kib": len(content) / 1024,
            "accuracy": float(np.mean(got.argmax(-1) == labels)),
            "rms_rel": output_errors([got], [want])[2],
            "checked_rms_rel": results[k].verification.rms_rel_error,
            "delegation": str(report),
            "partitions": report.partitions,
        }
    return out


def tables(rows):
    lines = [
        "| model | float32 ms | int8 ms | int8 / float32 | float32 KiB | int8 KiB | "
        "accuracy keras / float32 / int8 | int8 rms err | partitions float32 / int8 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, i = r["float32"], r["int8"]
        lines.append(
            f"| {r['model']} | {f['ms']:.3f} | {i['ms']:.3f} | {i['ratio']:.2f} | "
            f"{f['kib']:.0f} | {i['kib']:.0f} | {r['keras_accuracy']:.3f} / "
            f"{f['accuracy']:.3f} / {i['accuracy']:.3f} | {i['rms_rel']:.3f} | "
            f"{f['partitions']} / {i['partitions']} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    cells = MODELS[:1] if args.quick else MODELS
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for cell in cells:
            rows.append(row(*cell, size, args, workdir))
            print(f"done: {rows[-1]['model']}", flush=True)
    print(machine.header(load_tensorflow=True))
    print(tables(rows))


if __name__ == "__main__":
    main()
