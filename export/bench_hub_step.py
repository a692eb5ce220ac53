"""Decode ms of the generic keras-hub cached step (`litert_lm.hub_step`,
the model's own `call_with_cache`) against the hand-written steps that
Llama, Gemma and GPT-2 keep (`families` rows' `step`: each family's math
written from its layers over the heads-first cache), in
one process, on the Llama-style configuration of litert-torch's figures
(4 layers, hidden 256, 4 heads, 2 KV heads, intermediate 688; random
weights) with a vocabulary of 8000 in place of 32000, which keeps six
conversions in one process under 6 GB: medians of interleaved rounds of
decode steps, float32 files, default threads.

    PYTHONPATH=$PWD python -m export.bench_hub_step [--contexts 512]

`cached_model` picks the hand-written step for these three classes (no
sliding window); `cached_hub_model` is the generic step any CausalLM gets.
"""

import argparse
import time

import numpy as np

from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert_lm.decode_report import decode_delegation
from kerasnorm.export.litert_lm.hub_step import cached_hub_model
from kerasnorm.export.litert_lm.steps import cached_model
from kerasnorm.export.litert_lm.write import write_generative
from tests.export import lm_models

MEDIUM = {
    "vocabulary_size": 8000,
    "num_layers": 4,
    "hidden_dim": 256,
    "intermediate_dim": 688,
}
CONFIGS = {
    "llama": {**MEDIUM, "num_query_heads": 4, "num_key_value_heads": 2},
    "gemma": {
        **MEDIUM,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    "gpt2": {**MEDIUM, "num_heads": 4, "max_sequence_length": 1024},
}


def decode_round(generator, steps):
    generator.prefill([1, 2, 3])
    start = time.perf_counter()
    for _ in range(steps):
        generator.decode(1)
    return 1000 * (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", type=int, nargs="+", default=[512])
    parser.add_argument("--families", nargs="+", default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    print("| family | context | step | decode ms | partitions | file MB |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        model = lm_models.hub_causal_lm(family, seed=0, **CONFIGS[family])
        for context in args.contexts:
            files = {
                "hand-written": write_generative(
                    cached_model(model, context),
                    prefill_lengths=(16,),
                    max_sequence_length=context,
                ),
                "generic": write_generative(
                    cached_hub_model(model),
                    prefill_lengths=(16,),
                    max_sequence_length=context,
                ),
            }
            generators = {k: Generator(v) for k, v in files.items()}
            times = {k: [] for k in files}
            for _ in range(args.rounds):
                for key, generator in generators.items():
                    times[key].append(decode_round(generator, args.steps))
            for key, content in files.items():
                print(
                    f"| {family} | {context} | {key} | "
                    f"{np.median(times[key]):.3f} | "
                    f"{decode_delegation(content).partitions} | "
                    f"{len(content) / 2**20:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
