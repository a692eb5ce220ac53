"""The cost of a `.tflite` export's guarded first run (`verify.child`): the
child's start, and per export its load, allocation and one call of the
file, against the export's own time.

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from kerasnorm.export import to_tflite
    from kerasnorm.export.verify import child

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
    child.child()
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
                    child.first_run(path, {"input_0": x[:32]})
                    guards.append(time.perf_counter() - begin)
                e, g = np.median(exports), np.median(guards)
                print(
                    f"{name}, quantize={mode!r}: export {e:.2f} s, guarded "
                    f"first run {1e3 * g:.0f} ms ({100 * g / e:.1f} % of it)"
                )


if __name__ == "__main__":
    sys.exit(main())
