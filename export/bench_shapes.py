"""What a fixed shape buys on XNNPACK: the same model exported by `to_tflite`
with its dimensions dynamic (the default) and fixed (`batch_size=1`, and
`input_signature` for the length), run at the same shape, side by side.

    python -m export.bench_shapes               # ~3 min
    python -m export.bench_shapes --rounds 5    # a smoke run

Models: a conv net with GroupNorm (32x32x3), a Pre-LN encoder of kerasnorm's
LayerNorm with attention and a GELU MLP (64 tokens x 64), keras-hub's
`BertBackbone` (2 layers, hidden 64, token ids of length 64), and a speech
model `keras.Input((None, 32))` -> LayerNormGRU(64) -> LayerNorm -> Dense over
100 frames (a recurrent TFLite file keeps batch 1 either way: only its
length is dynamic). Each in float32 and in the fast int8 (the speech model:
"dynamic", since its full-integer modes need the length fixed).

Latency: LiteRT with XNNPACK on one thread (`litert.Runner`, which
allocates once per input shape: an app that keeps its shape), batch 1, at
the fixed file's shape; every file of one model is timed in the same
rounds, one measurement each per round in a rotating order, each a burst of
calls at least 20 ms long, in the calling thread's CPU time (which other
jobs of a shared machine do not inflate); the figures are medians over
`--rounds` rounds. Also each file's
XNNPACK partitions and the ops left outside them (the shape arithmetic a
dynamic dimension adds: SHAPE, STRIDED_SLICE, PACK, RESHAPE).
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
from export import files
from kerasnorm.export import to_tflite

L = keras.layers
BURST_SECONDS = 0.02


def conv_net():
    i = keras.Input((32, 32, 3), name="image")
    x = i
    for filters in (16, 32):
        x = L.Conv2D(filters, 3, padding="same")(x)
        x = kerasnorm.GroupNorm(4)(x)
        x = L.Activation("relu")(x)
        x = L.MaxPooling2D()(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(i, L.Dense(10, name="logits")(x)), (32, 32, 3), "float"


def encoder():
    i = keras.Input((None, 64), name="tokens")
    x = i
    for _ in range(2):
        h = kerasnorm.LayerNorm()(x)
        x = x + L.MultiHeadAttention(4, 16)(h, h)
        h = kerasnorm.LayerNorm()(x)
        x = x + L.Dense(64)(L.Dense(256, activation="gelu")(h))
    return keras.Model(i, L.Dense(10, name="logits")(x)), (64, 64), "float"


def bert():
    import keras_hub

    model = keras_hub.models.BertBackbone(
        vocabulary_size=1000,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=256,
        max_sequence_length=64,
    )
    return model, (64,), "tokens"


def speech():
    i = keras.Input((None, 32), name="input")
    x = kerasnorm.LayerNormGRU(64, return_sequences=True)(i)
    x = kerasnorm.LayerNorm()(x)
    return keras.Model(i, L.Dense(10, name="logits")(x)), (100, 32), "float"


MODELS = {"conv_net": conv_net, "encoder": encoder, "bert": bert, "speech": speech}


def data(model, shape, kind, n, seed):
    rng = np.random.default_rng(seed)
    if kind == "float":
        return rng.standard_normal((n, *shape)).astype("float32")
    length = shape[0]
    return {
        "token_ids": rng.integers(1, 1000, (n, length)).astype("int32"),
        "padding_mask": np.ones((n, length), "int32"),
        "segment_ids": np.zeros((n, length), "int32"),
    }


def signature_for(model, shape, kind):
    """`input_signature` fixing every undefined non-batch dimension at
    `shape` (by input name)."""
    if kind == "float":
        name = model.inputs[0].name
        return {name: (None, *shape)}
    return {key: (None, *shape) for key in model.input}


def bench(name, rounds, directory):
    keras.utils.set_random_seed(0)
    model, shape, kind = MODELS[name]()
    calibration = data(model, shape, kind, 64, seed=1)
    check = data(model, shape, kind, 8, seed=2)
    one = data(model, shape, kind, 1, seed=3)
    quantized = "dynamic" if name == "speech" else "int8"
    files_by_key, rows = {}, []
    for quantize in (None, quantized):
        for label, fixed in (("dynamic", False), ("fixed", True)):
            kwargs = {}
            if fixed:
                kwargs = {
                    "batch_size": 1,
                    "input_signature": signature_for(model, shape, kind),
                }
            path = os.path.join(directory, f"{name}-{quantize}-{label}.tflite")
            result = to_tflite(
                model,
                path,
                quantize=quantize,
                representative_data=calibration,
                verify_inputs=check,
                overwrite=True,
                **kwargs,
            )
            runner = files.runner(files.read(path))
            names = list(runner.input_shapes)
            feed = one if isinstance(one, dict) else {names[0]: one}
            key = (str(quantize or "float32"), label)
            files_by_key[key] = burst_timer(
                runner.named, feed, seconds=BURST_SECONDS, clock=time.thread_time
            )
            signature = runner.input_shapes
            rows.append((key, signature, result.verification.delegation))
    medians = interleaved_medians(files_by_key, rounds)
    print(f"\n{name}: batch 1 at {shape}, XNNPACK, 1 thread, median of {rounds}")
    print("| mode | file | shape_signature | ms | dynamic / fixed | XNNPACK |")
    print("|---|---|---|---:|---:|---|")
    for key, signature, delegation in rows:
        mode, label = key
        ratio = medians[key] / medians[(mode, "fixed")]
        shapes = ", ".join(
            f"{k} {[-1 if d is None else d for d in v]}"
            for k, v in sorted(signature.items())
        )
        print(
            f"| {mode} | {label} | {shapes} | {1e3 * medians[key]:.3f} | "
            f"{ratio:.2f} | {delegation} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--models", nargs="*", default=sorted(MODELS))
    args = parser.parse_args()
    print(machine.header(load_tensorflow=True))
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models:
            bench(name, args.rounds, directory)


if __name__ == "__main__":
    main()
