"""kerasnorm vs the Keras built-ins on the JAX (or PyTorch) backend, one run.

The shapes of bench_norms.py and bench_recurrent.py, side by side:

- norms: forward + backward (y, dL/dx, dL/dgamma, dL/dbeta) of LayerNorm,
  RMSNorm and GroupNorm against LayerNormalization, RMSNormalization and
  GroupNormalization. On JAX one `jax.jit` of `value_and_grad` over the
  layer's `stateless_call`; on PyTorch eager autograd.
- recurrent: a training step (forward + backward + Adam, `train_on_batch`)
  of LayerNormLSTM / LayerNormGRU against keras.layers.LSTM / GRU, with
  `jit_compile=True` on JAX (Keras' default, "auto", on PyTorch).

Each pair is timed in interleaved rounds and the median kept
(benchmarks/timing.py), so load from other processes hits both sides alike;
ratio = kerasnorm time / Keras time (< 1: kerasnorm is faster).

Usage: python -m benchmarks.bench_backend [--backend jax|torch] [--quick]
"""

import argparse
import os
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="jax", choices=["jax", "torch"])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--repeats", type=int, default=9, help="rounds (median)")
    parser.add_argument("--calls", type=int, default=3, help="calls per round")
    return parser.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # Keras reads its backend once, at import; Keras' data adapters load
    # TensorFlow where it is installed, which logs from C++ unless told not to.
    os.environ["KERAS_BACKEND"] = ARGS.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasnorm  # noqa: E402
from benchmarks import machine  # noqa: E402
from benchmarks.timing import interleaved_medians  # noqa: E402


def norm_pairs(quick):
    ln_shape = (512, 256) if quick else (4096, 1024)
    gn_shape = (4, 16, 16, 32) if quick else (16, 32, 32, 64)
    return [
        (
            "LayerNorm",
            ln_shape,
            kerasnorm.LayerNorm,
            lambda: keras.layers.LayerNormalization(epsilon=1e-5),
        ),
        (
            "RMSNorm",
            ln_shape,
            kerasnorm.RMSNorm,
            lambda: keras.layers.RMSNormalization(epsilon=1e-6),
        ),
        (
            "GroupNorm",
            gn_shape,
            lambda: kerasnorm.GroupNorm(groups=8),
            lambda: keras.layers.GroupNormalization(groups=8, epsilon=1e-5),
        ),
    ]


def jax_step(layer, shape):
    """One compiled call: y and the gradients w.r.t. x and every weight."""
    import jax

    layer.build(shape)
    trainable = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]

    def loss(weights, x, dy):
        y, _ = layer.stateless_call(weights, fixed, x)
        return jax.numpy.sum(y * dy), y

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))

    def step(x, dy):
        return jax.block_until_ready(grad(trainable, x, dy))

    return step


def torch_step(layer, shape):
    import torch

    layer.build(shape)
    weights = [v.value for v in layer.trainable_variables]

    def step(x, dy):
        x = x.detach().requires_grad_(True)
        y = layer(x)
        return torch.autograd.grad((y * dy).sum(), [x, *weights])

    return step


def time_calls(step, x, dy, calls):
    start = time.perf_counter()
    for _ in range(calls):
        step(x, dy)
    return (time.perf_counter() - start) / calls


def bench_norms(args):
    make_step = jax_step if args.backend == "jax" else torch_step
    rng = np.random.default_rng(0)
    print(f"{'layer':<10} {'shape':<16} {'kerasnorm ms':>12} {'Keras ms':>9} ratio")
    for name, shape, ours, theirs in norm_pairs(args.quick):
        x = keras.ops.convert_to_tensor(rng.standard_normal(shape).astype("float32"))
        dy = keras.ops.convert_to_tensor(rng.standard_normal(shape).astype("float32"))
        steps = {"ours": make_step(ours(), shape), "keras": make_step(theirs(), shape)}
        for step in steps.values():
            time_calls(step, x, dy, 2)  # trace, compile, warm up
        medians = interleaved_medians(
            {
                k: lambda s=s, x=x, dy=dy: time_calls(s, x, dy, args.calls)
                for k, s in steps.items()
            },
            args.repeats,
        )
        t1, t2 = medians["ours"], medians["keras"]
        print(
            f"{name:<10} {'x'.join(map(str, shape)):<16} {t1 * 1e3:>12.2f} "
            f"{t2 * 1e3:>9.2f} {t1 / t2:>6.2f}"
        )


def recurrent_model(layer, batch, steps, features, jit):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((steps, features), batch_size=batch)
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=jit)
    return model


def train_steps(model, x, y, calls):
    start = time.perf_counter()
    for _ in range(calls):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / calls


def bench_recurrent(args):
    batch, steps, features, units = (
        (16, 20, 32, 64) if args.quick else (64, 100, 128, 256)
    )
    jit = True if args.backend == "jax" else "auto"
    print(
        f"training step: batch {batch}, {steps} steps, input {features}, "
        f"units {units}, Adam, jit_compile={jit}"
    )
    print(f"{'kerasnorm':<14} {'Keras':<6} {'kerasnorm ms':>12} {'Keras ms':>9} ratio")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, features)).astype("float32")
    y = rng.standard_normal((batch, units)).astype("float32")
    for name, keras_name, ours, theirs in (
        ("LayerNormLSTM", "LSTM", kerasnorm.LayerNormLSTM, keras.layers.LSTM),
        ("LayerNormGRU", "GRU", kerasnorm.LayerNormGRU, keras.layers.GRU),
    ):
        models = {
            "ours": recurrent_model(ours(units), batch, steps, features, jit),
            "keras": recurrent_model(theirs(units), batch, steps, features, jit),
        }
        for model in models.values():
            train_steps(model, x, y, 2)  # trace, compile, warm up
        medians = interleaved_medians(
            {
                k: lambda m=m: train_steps(m, x, y, args.calls)
                for k, m in models.items()
            },
            args.repeats,
        )
        t1, t2 = medians["ours"], medians["keras"]
        print(
            f"{name:<14} {keras_name:<6} {t1 * 1e3:>12.1f} {t2 * 1e3:>9.1f} "
            f"{t1 / t2:>6.2f}"
        )


def main(args):
    print(machine.header())
    print(f"Keras backend: {keras.backend.backend()}")
    bench_norms(args)
    bench_recurrent(args)


if __name__ == "__main__":
    main(ARGS)
