"""Where the wide conv net's float32 time goes: timed sub-graphs of
`models.wide_conv_net` (three Conv2D(64, 3) on 32 x 32 x 16, each followed by
the norm and a ReLU), kerasnorm's file against Keras' export of the twin.

    python -m export.profile_twins                 # ~2 min
    python -m export.profile_twins --rounds 61 --norms LayerNorm RMSNorm

Per norm, in the same interleaved rounds (LiteRT, XNNPACK, one thread,
batch 1, thread CPU time, medians):

- the whole nets: kerasnorm's `to_tflite` (fold on), Keras' export of the
  twin, and the net with no norm at all (`Identity`: the convolutions, the
  ReLUs and the head), the floor any lowering of the norm stays above;
- one norm alone on (1, 32, 32, 64), each exporter's file, followed by a
  ReLU as in the net;
- the ops the norms are made of, one per file, on (1, 32, 32, 64): a
  plain pass (`x * 2`), the `MEAN` over the channels, a product by a
  per-pixel (1, 32, 32, 1) factor, one by a per-channel (64,) factor, a
  1 x 1 depthwise op with bias, and the 3 x 3 convolution 64 -> 64.

The "no norm / Keras" column bounds what a faster norm can reach: the
kerasnorm / Keras ratio cannot fall below it.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from benchmarks import machine
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import files
from export import models
from export import ondevice_pairs
from kerasnorm.export import litert
from kerasnorm.export import to_tflite

SHAPE = (1, 32, 32, 64)


def _invoke(content, x):
    interpreter = Interpreter(model_content=content, num_threads=1)
    (entry,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(entry["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(entry["index"], x)
    return interpreter.invoke


def _op_file(fn):
    """The float32 `.tflite` bytes of `fn` on one (1, 32, 32, 64) tensor."""
    spec = tf.TensorSpec(SHAPE, tf.float32)
    concrete = tf.function(fn, input_signature=[spec]).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    return converter.convert()


def _ops():
    rng = np.random.default_rng(0)
    gain = tf.constant(rng.uniform(0.5, 1.5, SHAPE[-1]).astype("float32"))
    kernel = tf.constant(rng.normal(0, 0.1, (3, 3, 64, 64)).astype("float32"))
    depthwise = tf.constant(rng.normal(0, 1, (1, 1, 64, 1)).astype("float32"))
    return {
        "op: x * 2": lambda x: x * 2.0,
        "op: MEAN over C": lambda x: tf.reduce_mean(x, -1, keepdims=True),
        "op: x * per-pixel": lambda x: x * tf.reduce_mean(x, -1, keepdims=True),
        "op: x * per-channel gain": lambda x: x * gain,
        "op: 1x1 depthwise + bias": lambda x: (
            tf.nn.depthwise_conv2d(x, depthwise, [1, 1, 1, 1], "VALID") + gain
        ),
        "op: Conv2D(64, 3) 64->64": lambda x: tf.nn.conv2d(x, kernel, 1, "SAME"),
    }


def _norm_alone(norm):
    inputs = keras.Input(SHAPE[1:])
    return keras.Model(inputs, keras.layers.ReLU()(norm()(inputs)))


def candidates(name, workdir):
    """{label: (file bytes, input)} of one norm's rows."""
    ours, theirs = ondevice_pairs.NORMS[name]
    x_net = np.random.default_rng(1).uniform(-1, 1, (1, 32, 32, 16))
    x_net = x_net.astype("float32")
    x = np.random.default_rng(2).normal(0, 1, SHAPE).astype("float32")
    out = {}
    keras.utils.set_random_seed(0)
    pairs = {
        "net": (models.wide_conv_net(ours), models.wide_conv_net(theirs), x_net),
        "norm alone": (_norm_alone(ours), _norm_alone(theirs), x),
    }
    for label, (model, twin, data) in pairs.items():
        models.randomize_norms(model)
        twin.set_weights(model.get_weights())
        path = f"{workdir}/{label}.tflite"
        to_tflite(model, path, verify_inputs=data, overwrite=True)
        out[f"{label}: kerasnorm"] = (files.read(path), data)
        keras_path = f"{workdir}/{label}_keras.tflite"
        out[f"{label}: Keras"] = (
            files.keras_export(twin, keras_path, None, data)[0],
            data,
        )
    plain = models.wide_conv_net(lambda: keras.layers.Identity())
    to_tflite(plain, f"{workdir}/plain.tflite", overwrite=True)
    out["net: no norm"] = (files.read(f"{workdir}/plain.tflite"), x_net)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument(
        "--norms", nargs="+", default=["LayerNorm", "RMSNorm", "GroupNorm"]
    )
    args = parser.parse_args(argv)
    print(f"{args.rounds} rounds, batch 1, one thread, thread CPU time")
    print(machine.header(load_tensorflow=True), flush=True)
    x = np.random.default_rng(2).normal(0, 1, SHAPE).astype("float32")
    ops = {label: (_op_file(fn), x) for label, fn in _ops().items()}
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.norms:
            rows = {**candidates(name, workdir), **ops}
            timers = {
                label: burst_timer(_invoke(content, data), clock=time.thread_time)
                for label, (content, data) in rows.items()
            }
            us = {
                k: 1e6 * v for k, v in interleaved_medians(timers, args.rounds).items()
            }
            print(f"\n{name}")
            for label, (content, _) in rows.items():
                counts = litert.op_counts(content)
                listed = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
                print(f"  {label:34s}{us[label]:10.1f} us   {listed}")
            keras_net, plain = us["net: Keras"], us["net: no norm"]
            print(
                f"  kerasnorm / Keras {us['net: kerasnorm'] / keras_net:.3f}, "
                f"no norm / Keras {plain / keras_net:.3f}; the three norms "
                f"cost {us['net: kerasnorm'] - plain:.1f} us (kerasnorm) and "
                f"{keras_net - plain:.1f} us (Keras)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
