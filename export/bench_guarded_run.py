"""The cost of a `.tflite` export's guarded first run (docs/guides/export.md,
"When LiteRT crashes"): the child's start (Python, NumPy and LiteRT
imported), and per export the child's work, timed here with the public
pieces it uses: the first verification batch written to an `.npz` and read
back, the file loaded by LiteRT, allocated and called once; against the
export's own time (which includes the child's run).

    python -m export.bench_guarded_run [--rounds 5]

Models: the time-series Transformer of tests/export/test_tflite_single_channel.py
(two blocks, input (32, 1)) and a small conv net, float32 and int8. Medians of
interleaved rounds in one process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _models():
    import keras

    L = keras.layers
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 1))
    x = inputs
    for _ in range(2):
        y = L.LayerNormalization(epsilon=1e-6)(x)
        res = L.MultiHeadAttention(key_dim=16, num_heads=2)(y, y) + x
        y = L.Conv1D(4, 1, activation="relu")(L.LayerNormalization(epsilon=1e-6)(res))
        x = L.Conv1D(1, 1)(y) + res
    x = L.GlobalAveragePooling1D(data_format="channels_first")(x)
    series = keras.Model(inputs, L.Dense(2)(L.Dense(32, activation="relu")(x)))
    inputs = keras.Input((32, 32, 3))
    x = inputs
    for width in (16, 32, 64):
        x = L.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
    conv = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(x)))
    rng = np.random.default_rng(0)
    return {
        "time-series Transformer": (series, rng.normal(size=(64, 32, 1))),
        "conv net 32x32": (conv, rng.normal(size=(64, 32, 32, 3))),
    }


def _child_work(path, batch, tmp):
    """What the child does for one export (`kerasnorm.export`'s guarded
    first run), in this process."""
    from ai_edge_litert.interpreter import Interpreter

    feeds = os.path.join(tmp, "inputs.npz")
    np.savez(feeds, input_0=batch)
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    runner = interpreter.get_signature_runner("serving_default")
    (detail,) = runner.get_input_details().values()
    with np.load(feeds) as archive:
        value = archive["input_0"]
    fixed = int(detail["shape_signature"][0])
    value = value if fixed < 0 else value[:fixed]
    scale, zero = detail["quantization"]
    if scale:
        value = np.round(value / scale + zero)
    runner(input_0=value.astype(detail["dtype"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from kerasnorm.export import to_tflite

    start = time.perf_counter()
    probe = subprocess.run(
        [sys.executable, "-P", "-c", "import ai_edge_litert.interpreter"], check=True
    )
    del probe
    print(
        f"child start (Python + NumPy + LiteRT import): "
        f"{time.perf_counter() - start:.2f} s, once per session, "
        "overlapping the first conversion"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, x) in _models().items():
            x = x.astype("float32")
            for mode in (None, "int8"):
                path = os.path.join(tmp, f"m_{mode}.tflite")
                exports, guards = [], []
                for _ in range(args.rounds):
                    begin = time.perf_counter()
                    to_tflite(
                        model,
                        path,
                        quantize=mode,
                        representative_data=x,
                        verify_inputs=x,
                        overwrite=True,
                    )
                    exports.append(time.perf_counter() - begin)
                    begin = time.perf_counter()
                    _child_work(path, x[:32], tmp)
                    guards.append(time.perf_counter() - begin)
                e, g = np.median(exports), np.median(guards)
                print(
                    f"{name}, quantize={mode!r}: export {e:.2f} s, guarded "
                    f"first run {1e3 * g:.0f} ms ({100 * g / e:.1f} % of it)"
                )


if __name__ == "__main__":
    sys.exit(main())
