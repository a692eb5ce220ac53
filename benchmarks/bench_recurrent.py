"""Training-step speed of kerasnorm's LN-LSTM / LN-GRU vs Keras' LSTM / GRU.

One training step = forward + backward + Adam update of a model
`Input -> recurrent layer (last output) -> MSE`, compiled with
`jit_compile=True`, at batch 64, 100 steps, input 128, units 256 (`--quick`:
batch 16, 20 steps, input 32, units 64). The two sides of each pair are timed
in interleaved rounds and the median per-step time is kept, so load from other
processes hits both alike. Printed per pair:

- ratio = first / second (< 1: the first is faster);
- achieved GFLOP/s of each side, counting only the matmuls (forward
  2*B*T*(D+H)*G*H, backward twice that), against two measured matmul rates:
  one large square matmul, and a while loop of (B, H) x (H, G*H) matmuls,
  which bounds what a time loop can reach.

Pairs: LayerNormLSTM vs keras.layers.LSTM, LayerNormGRU vs keras.layers.GRU,
LayerNormLSTM vs a straightforward LN-LSTM cell (keras.layers.LayerNormalization
inside keras.layers.RNN, everything in the loop).

Usage: python benchmarks/bench_recurrent.py [--quick] [--repeats N]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from timing import interleaved_medians

import kerasnorm


class NaiveLayerNormLSTMCell(keras.layers.Layer):
    """The LN-LSTM as one would first write it: Keras LayerNormalization
    layers in the cell, input projection and its LN inside the time loop."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = [units, units]
        self.output_size = units
        self.norm_x = keras.layers.LayerNormalization(epsilon=1e-5)
        self.norm_h = keras.layers.LayerNormalization(epsilon=1e-5)
        self.norm_c = keras.layers.LayerNormalization(epsilon=1e-5)

    def build(self, input_shape):
        width = 4 * self.units
        self.kernel = self.add_weight(
            shape=(input_shape[-1], width), initializer="glorot_uniform"
        )
        self.recurrent_kernel = self.add_weight(
            shape=(self.units, width), initializer="orthogonal"
        )
        self.bias = self.add_weight(shape=(width,), initializer="zeros")
        self.norm_x.build((None, width))
        self.norm_h.build((None, width))
        self.norm_c.build((None, self.units))

    def call(self, inputs, states):
        h, c = states
        z = (
            self.norm_x(inputs @ self.kernel)
            + self.norm_h(h @ self.recurrent_kernel)
            + self.bias
        )
        i, f, g, o = keras.ops.split(z, 4, axis=-1)
        c = keras.ops.sigmoid(f) * c + keras.ops.sigmoid(i) * keras.ops.tanh(g)
        h = keras.ops.sigmoid(o) * keras.ops.tanh(self.norm_c(c))
        return h, [h, c]


def pairs():
    return [
        (
            "LayerNormLSTM",
            "keras LSTM",
            4,
            lambda u: kerasnorm.LayerNormLSTM(u),
            lambda u: keras.layers.LSTM(u),
        ),
        (
            "LayerNormGRU",
            "keras GRU",
            3,
            lambda u: kerasnorm.LayerNormGRU(u),
            lambda u: keras.layers.GRU(u),
        ),
        (
            "LayerNormLSTM",
            "naive LN-LSTM",
            4,
            lambda u: kerasnorm.LayerNormLSTM(u),
            lambda u: keras.layers.RNN(NaiveLayerNormLSTMCell(u)),
        ),
    ]


def make_model(layer_fn, batch, steps, features, units):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((steps, features), batch_size=batch)
    model = keras.Model(inputs, layer_fn(units)(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    return model


def time_steps(model, x, y, calls):
    start = time.perf_counter()
    for _ in range(calls):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / calls


def matmul_rate(m, k, n, repeats):
    """Median GFLOP/s of an XLA-compiled (m, k) x (k, n) float32 matmul."""
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((m, k)).astype("float32"))
    b = tf.constant(rng.standard_normal((k, n)).astype("float32"))
    calls = max(1, int(2e9 // (2 * m * k * n)))

    @tf.function(jit_compile=True)
    def product(a, b):
        return tf.matmul(a, b)

    product(a, b).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = product(a, b)
        out.numpy()
        times.append((time.perf_counter() - start) / calls)
    return 2 * m * k * n / statistics.median(times) / 1e9


def loop_matmul_rate(batch, units, gates, steps, repeats):
    """Median GFLOP/s of `steps` chained (batch, units) x (units, gates*units)
    matmuls in one XLA while loop: the rate a time loop's matmul can reach."""
    rng = np.random.default_rng(0)
    u = tf.constant(rng.standard_normal((units, gates * units)).astype("float32"))
    h0 = tf.constant(rng.standard_normal((batch, units)).astype("float32"))

    @tf.function(jit_compile=True)
    def chain(h):
        def body(t, h):
            return t + 1, tf.matmul(h, u)[:, :units] * 1e-3

        return tf.while_loop(lambda t, h: t < steps, body, (0, h))[1]

    chain(h0).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        chain(h0).numpy()
        times.append(time.perf_counter() - start)
    return steps * 2 * batch * units * gates * units / statistics.median(times) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--repeats", type=int, default=7, help="rounds (median)")
    parser.add_argument("--calls", type=int, default=3, help="steps per round")
    args = parser.parse_args()
    batch, steps, features, units = (
        (16, 20, 32, 64) if args.quick else (64, 100, 128, 256)
    )

    big = matmul_rate(2048, 2048, 2048, args.repeats)
    print(f"CPU cores: {os.cpu_count()}")
    print(f"XLA matmul 2048^3: {big:.1f} GFLOP/s")
    for gates in (3, 4):
        rate = loop_matmul_rate(batch, units, gates, steps, args.repeats)
        print(
            f"XLA while loop of {steps} ({batch}x{units}) x "
            f"({units}x{gates * units}) matmuls: {rate:.1f} GFLOP/s"
        )
    print(
        f"training step: batch {batch}, {steps} steps, input {features}, "
        f"units {units}, Adam, jit_compile=True"
    )
    header = (
        f"{'first':<14} {'second':<14} {'first ms':>9} {'second ms':>9} "
        f"{'ratio':>6} {'GFLOP/s':>15} {'% of 2048^3':>12}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, features)).astype("float32")
    y = rng.standard_normal((batch, units)).astype("float32")
    for first, second, gates, first_fn, second_fn in pairs():
        flops = 3 * 2 * batch * steps * (features + units) * gates * units
        models = {
            "first": make_model(first_fn, batch, steps, features, units),
            "second": make_model(second_fn, batch, steps, features, units),
        }
        for model in models.values():
            time_steps(model, x, y, 2)  # trace, compile, warm up
        medians = interleaved_medians(
            {
                key: lambda model=model: time_steps(model, x, y, args.calls)
                for key, model in models.items()
            },
            args.repeats,
        )
        t1, t2 = medians["first"], medians["second"]
        g1, g2 = flops / t1 / 1e9, flops / t2 / 1e9
        print(
            f"{first:<14} {second:<14} {t1 * 1e3:>9.1f} {t2 * 1e3:>9.1f} "
            f"{t1 / t2:>6.2f} {g1:>7.1f} / {g2:<6.1f} "
            f"{100 * g1 / big:>5.0f}% / {100 * g2 / big:.0f}%"
        )


if __name__ == "__main__":
    main()
