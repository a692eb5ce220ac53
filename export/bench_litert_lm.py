"""Decode and prefill ms of a generative file against the whole-sequence
file's cost per generated token, on the Llama-style configuration of
litert-torch's figures (vocab 32000, 4 layers, hidden 256, 4 heads, 2 KV
heads, intermediate 688; random weights), one thread, medians of
interleaved rounds.

    PYTHONPATH=$PWD python -m export.bench_litert_lm [--contexts 128 512]
"""

import argparse
import os
import tempfile
import time

import numpy as np

from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from kerasnorm.export import to_tflite
from tests.export import lm_models


def llama():
    return lm_models.causal_lm("llama", "medium", seed=0)


def median_ms(function, rounds=15):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--modes", nargs="+", default=["none", "dynamic"])
    args = parser.parse_args()
    model = llama()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            quantize = None if mode == "none" else mode
            for context in args.contexts:
                path = os.path.join(tmp, f"lm_{mode}_{context}.tflite")
                result = to_litert_lm(
                    model,
                    path,
                    max_sequence_length=context,
                    prefill_lengths=(16,),
                    quantize=quantize,
                )
                generator = litert.Generator(open(path, "rb").read())
                runner = generator._runners["decode"]
                caches = {
                    n: np.zeros(s, np.float32)
                    for n, s in generator._cache_shapes.items()
                }
                last = np.array([context - 1], np.int32)
                token = np.array([[5]], np.int32)
                decode = median_ms(
                    lambda runner=runner, caches=caches, last=last, token=token: runner(
                        tokens=token, input_pos=last, **caches
                    )
                )
                prefill_runner = generator._runners["prefill"]
                tokens16 = np.ones((1, 16), np.int32)
                pos16 = np.arange(16, dtype=np.int32)
                prefill = median_ms(
                    lambda r=prefill_runner, c=caches, t=tokens16, p=pos16: r(
                        tokens=t, input_pos=p, **c
                    )
                )
                whole_path = os.path.join(tmp, f"whole_{mode}_{context}.tflite")
                ids = np.ones((1, context), np.int32)
                feed = {"token_ids": ids, "padding_mask": np.ones((1, context), bool)}
                # One sample to check with: the default batch of samples at
                # 512 tokens x 32000 logits is gigabytes.
                to_tflite(
                    model,
                    whole_path,
                    quantize=quantize,
                    verify_inputs=feed,
                    input_signature={
                        "token_ids": (1, context),
                        "padding_mask": (1, context),
                    },
                )
                whole = litert.Runner(open(whole_path, "rb").read())
                full = median_ms(lambda whole=whole, feed=feed: whole(feed), rounds=7)
                rows.append(
                    (
                        mode,
                        context,
                        decode,
                        prefill,
                        full,
                        full / decode,
                        result.size_bytes,
                    )
                )
                print(rows[-1], flush=True)
    print(
        "| mode | context | decode ms | prefill_16 ms "
        "| whole-sequence ms/token | ratio | file MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, context, decode, prefill, full, ratio, size in rows:
        print(
            f"| {mode} | {context} | {decode:.2f} | {prefill:.2f} | {full:.1f} "
            f"| {ratio:.0f}x | {size / 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
