"""Whether fusing the products that read one input (query/key/value; gate
and up) speeds up a dynamic-range int8 decode step in LiteRT.

    PYTHONPATH=$PWD python -m export.bench_fused_products --threads 1

Two `.tflite` files of the same arithmetic at SmolLM2-135M's shapes (30
blocks; hidden 576, key/value 192, feed-forward 1536; one token; random
weights), written by TensorFlow Lite's converter with dynamic-range int8
weights (`Optimize.DEFAULT`): one with the five products of each block
separate (as kerasnorm's step wrote them, 211 in SmolLM2), one with
query/key/value as one product and gate/up as one, split after (as
litert-torch writes them, 151). No attention, no norms: the products and
their input quantization alone. Each file is timed by the interpreter
(XNNPACK), medians of interleaved rounds; the ratio is separate / fused
(above 1: fusing is faster). A measurement of the lever apart from the
rest of the step; the step kerasnorm writes fuses them since
(`kerasnorm.export.litert_lm.fused_products`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

D, KV, F, LAYERS = 576, 192, 1536, 30


def step(fused, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def weight(rows, cols):
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.03
        return tf.constant(w)

    blocks = []
    for _ in range(LAYERS):
        if fused:
            blocks.append((weight(D, D + 2 * KV), weight(D, 2 * F), weight(F, D)))
        else:
            shapes = ((D, D), (D, KV), (D, KV), (D, F), (D, F), (F, D))
            blocks.append(tuple(weight(*s) for s in shapes))

    @tf.function(input_signature=[tf.TensorSpec((1, D), tf.float32)])
    def call(x):
        for ws in blocks:
            if fused:
                q, k, v = tf.split(x @ ws[0], [D, KV, KV], axis=-1)
                g, u = tf.split(x @ ws[1], [F, F], axis=-1)
            else:
                q, k, v, g, u = (x @ w for w in ws[:5])
            mixed = q + tf.tile(k + v, [1, 3])
            x = x + (tf.nn.silu(g) * u) @ ws[-1] + 0.01 * mixed
        return x

    return call


def dynamic_int8(call):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [call.get_concrete_function()]
    )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args(argv)
    from ai_edge_litert.interpreter import Interpreter

    x = np.random.default_rng(1).standard_normal((1, D)).astype(np.float32)
    files = {
        name: dynamic_int8(step(f))
        for name, f in (("separate", False), ("fused", True))
    }
    interpreters = {}
    for name, content in files.items():
        interpreter = Interpreter(model_content=content, num_threads=args.threads)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        interpreters[name] = interpreter
    times = {name: [] for name in files}
    for _ in range(args.rounds):
        for name, interpreter in interpreters.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                interpreter.invoke()
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    for name, ms in times.items():
        print(
            f"{name}: {np.median(ms):.3f} ms per step, {len(files[name]) / 1e6:.1f} MB"
        )
    ratios = [a / b for a, b in zip(times["separate"], times["fused"], strict=True)]
    print(f"separate / fused: {np.median(ratios):.3f} (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
