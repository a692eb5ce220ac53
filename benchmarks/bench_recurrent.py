"""Training-step speed of kerasnorm's LN-LSTM / LN-GRU vs Keras' LSTM / GRU.

One training step = forward + backward + Adam update of a model
`Input -> recurrent layer (last output) -> MSE`, at batch 64, 100 steps,
input 128, units 256 (`--quick`: batch 16, 20 steps, input 32, units 64).
The two sides of each pair are timed in interleaved rounds and the median
per-step time is kept, so load from other processes hits both alike. Printed
per pair:

- ratio = first / second (< 1: the first is faster);
- achieved GFLOP/s of each side, counting only the matmuls (forward
  2*B*T*(D+H)*G*H, backward twice that), against two measured matmul rates:
  one large square matmul, and a while loop of (B, H) x (H, G*H) matmuls,
  which bounds what a time loop can reach.

Pairs: LayerNormLSTM vs keras.layers.LSTM, LayerNormGRU vs keras.layers.GRU,
LayerNormLSTM vs a straightforward LN-LSTM cell (keras.layers.LayerNormalization
inside keras.layers.RNN, everything in the loop); each with XLA
(`jit_compile=True`) and without (`jit_compile=False`: TensorFlow's graph
mode, with oneDNN on x86, which is what Keras' default `"auto"` runs on CPU).

`--grid`: the LN layers against Keras' over batch 16/64/256 x units 128/256/
1024 (100 steps, input 128), with and without XLA; fewer rounds for the large
cells. `--bf16`: each layer under `mixed_bfloat16` against itself in float32.
The load average is printed before and after: the machines are shared, and
only the ratios of interleaved rounds are comparable between runs.

Usage: python -m benchmarks.bench_recurrent [--quick] [--repeats N]
       [--grid] [--bf16]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import kerasnorm
from benchmarks import machine
from benchmarks.timing import interleaved_medians


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


def make_model(layer_fn, batch, steps, features, units, jit=True, policy="float32"):
    keras.utils.set_random_seed(0)
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        inputs = keras.Input((steps, features), batch_size=batch)
        outputs = keras.layers.Activation("linear", dtype="float32")(
            layer_fn(units)(inputs)
        )
        model = keras.Model(inputs, outputs)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    model.compile(optimizer="adam", loss="mse", jit_compile=jit)
    return model


def compare(first_fn, second_fn, shape, rounds, calls, first=None, second=None):
    """Median seconds per training step of two models, interleaved.

    `first` / `second`: keyword arguments of `make_model` (jit, policy)."""
    batch, steps, features, units = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, features)).astype("float32")
    y = rng.standard_normal((batch, units)).astype("float32")
    models = {
        "first": make_model(first_fn, *shape, **(first or {})),
        "second": make_model(second_fn, *shape, **(second or {})),
    }
    for model in models.values():
        time_steps(model, x, y, 2)  # trace, compile, warm up
    medians = interleaved_medians(
        {
            key: lambda model=model: time_steps(model, x, y, calls)
            for key, model in models.items()
        },
        rounds,
    )
    return medians["first"], medians["second"]


def load():
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def grid(args):
    """Ratio LN / Keras over batch x units, with and without XLA."""
    print(f"grid: 100 steps, input 128, Adam; {load()}")
    header = (
        f"{'pair':<28} {'XLA':<4} {'batch':>5} {'units':>5} {'LN ms':>9} "
        f"{'Keras ms':>9} {'ratio':>6} {'rounds':>6}"
    )
    print(header)
    print("-" * len(header))
    for first, second, gates, first_fn, second_fn in pairs()[:2]:
        for jit in (True, False):
            for units in (128, 256, 1024):
                for batch in (16, 64, 256):
                    gflop = 3 * 2 * batch * 100 * (128 + units) * gates * units / 1e9
                    # About 7 rounds where a step takes < 0.2 s, down to 3
                    # for the largest cells (> 100 GFLOP a step).
                    rounds = 7 if gflop < 10 else 5 if gflop < 100 else 3
                    rounds = min(rounds, args.repeats)
                    calls = 3 if gflop < 10 else 1
                    t1, t2 = compare(
                        first_fn,
                        second_fn,
                        (batch, 100, 128, units),
                        rounds,
                        calls,
                        {"jit": jit},
                        {"jit": jit},
                    )
                    print(
                        f"{first + ' / ' + second:<28} {'yes' if jit else 'no':<4} "
                        f"{batch:>5} {units:>5} {t1 * 1e3:>9.1f} {t2 * 1e3:>9.1f} "
                        f"{t1 / t2:>6.2f} {rounds:>6}",
                        flush=True,
                    )
    print(load())


def bf16(args, shape):
    """Each layer under mixed_bfloat16 against itself in float32."""
    print(f"mixed_bfloat16 / float32, shape {shape}; {load()}")
    header = f"{'layer':<14} {'XLA':<4} {'bf16 ms':>9} {'fp32 ms':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    layers = {}
    for first, second, _, first_fn, second_fn in pairs()[:2]:
        layers[first], layers[second] = first_fn, second_fn
    for jit in (True, False):
        for name, fn in layers.items():
            t1, t2 = compare(
                fn,
                fn,
                shape,
                args.repeats,
                args.calls,
                {"jit": jit, "policy": "mixed_bfloat16"},
                {"jit": jit},
            )
            print(
                f"{name:<14} {'yes' if jit else 'no':<4} {t1 * 1e3:>9.1f} "
                f"{t2 * 1e3:>9.1f} {t1 / t2:>6.2f}",
                flush=True,
            )
    print(load())


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
    parser.add_argument("--grid", action="store_true", help="batch x units grid")
    parser.add_argument("--bf16", action="store_true", help="mixed_bfloat16")
    args = parser.parse_args()
    print(machine.header())
    shape = (16, 20, 32, 64) if args.quick else (64, 100, 128, 256)
    batch, steps, features, units = shape
    if args.grid:
        grid(args)
        return
    if args.bf16:
        bf16(args, shape)
        return

    print(f"CPU cores: {os.cpu_count()}; {load()}")
    big = matmul_rate(2048, 2048, 2048, args.repeats)
    print(f"XLA matmul 2048^3: {big:.1f} GFLOP/s")
    for gates in (3, 4):
        rate = loop_matmul_rate(batch, units, gates, steps, args.repeats)
        print(
            f"XLA while loop of {steps} ({batch}x{units}) x "
            f"({units}x{gates * units}) matmuls: {rate:.1f} GFLOP/s"
        )
    print(
        f"training step: batch {batch}, {steps} steps, input {features}, "
        f"units {units}, Adam"
    )
    header = (
        f"{'first':<14} {'second':<14} {'XLA':<4} {'first ms':>9} {'second ms':>9} "
        f"{'ratio':>6} {'GFLOP/s':>15} {'% of 2048^3':>12}"
    )
    print(header)
    print("-" * len(header))
    for jit in (True, False):
        for first, second, gates, first_fn, second_fn in pairs():
            flops = 3 * 2 * batch * steps * (features + units) * gates * units
            t1, t2 = compare(
                first_fn,
                second_fn,
                shape,
                args.repeats,
                args.calls,
                {"jit": jit},
                {"jit": jit},
            )
            g1, g2 = flops / t1 / 1e9, flops / t2 / 1e9
            print(
                f"{first:<14} {second:<14} {'yes' if jit else 'no':<4} "
                f"{t1 * 1e3:>9.1f} {t2 * 1e3:>9.1f} "
                f"{t1 / t2:>6.2f} {g1:>7.1f} / {g2:<6.1f} "
                f"{100 * g1 / big:>5.0f}% / {100 * g2 / big:.0f}%",
                flush=True,
            )
    print(load())


if __name__ == "__main__":
    main()
