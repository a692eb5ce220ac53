"""Decode ms of the cached step every keras-hub CausalLM generates through
(`litert_lm.hub_step`, the model's own `call_with_cache`), per family, in
one process, on the Llama-style configuration of litert-torch's figures
(4 layers, hidden 256, 4 heads, 2 KV heads, intermediate 688; random
weights) with a vocabulary of 8000 in place of 32000: medians of
interleaved rounds of decode steps, float32 files, default threads, with
each decode step's XNNPACK partitions and the file's size.

    PYTHONPATH=$PWD python -m export.bench_hub_step [--contexts 512]
    PYTHONPATH=$PWD python -m export.bench_hub_step --peer-dir /tmp/peer \
        --families llama smollm2 gemma3 qwen2 phi3

With `--peer-dir`, each family's decode is also timed beside litert-torch's
file of the same configuration (`export/peers/litert_torch_families.py`
writes them, in an environment of its own, as
`<family>_none_c<context>.tflite`; kerasnorm's is the file `to_litert_lm`
writes and checks): both files run on ai-edge-litert's
interpreter, XNNPACK, one thread, their `decode` signature called with its
caches at position context - 1 (`export.bench_generation`'s harness),
every file of every family in the same interleaved rounds, medians of the
calling thread's CPU time (which other jobs of a shared machine do not
inflate); the table gives the ratio kerasnorm / litert-torch.

Until the step read the file's cache in place (no transposes, no repeated
keys, the mask in integers), Llama, Gemma and GPT-2 kept steps written by
hand; this script measured the generic step against them (within noise of
each other, docs/benchmarks.md) before they were deleted.
"""

import argparse
import os
import time

import numpy as np

from export.bench_generation import PEER_MODES
from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert_lm.decode_report import decode_delegation
from kerasnorm.export.litert_lm.hub_step import cached_hub_model
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
    "gemma3": {
        **MEDIUM,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "use_sliding_window_attention": False,
    },
    "qwen2": {**MEDIUM, "num_query_heads": 4, "num_key_value_heads": 2},
    # SmolLM2 is keras-hub's Llama 3 with the head tied to the embedding.
    "smollm2": {
        **MEDIUM,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "phi3": {
        **MEDIUM,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "max_sequence_length": 4096,
        "pretraining_sequence_length": 4096,
        "rope_scaling_type": None,
    },
}
# keras-hub's family of a row whose name is not one (lm_models.HUB_FAMILIES).
HUB_FAMILY = {"smollm2": "llama3"}


def distinct(model, seed=0):
    """Moves every weight by seeded noise. keras-hub draws a layer's key and
    value kernels alike from one seed, and the converter computes two
    identical products once: a file of the model as built holds one
    product fewer per layer than a trained model's (and than the peer's)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = np.asarray(weight.numpy(), dtype="float32")
        noise = 0.02 * rng.standard_normal(value.shape).astype("float32")
        weight.assign(value + noise)


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
    parser.add_argument("--peer-dir", default=None)
    parser.add_argument(
        "--quantize",
        default=None,
        choices=sorted(PEER_MODES, key=str)[1:],
        help="with --peer-dir: a generative mode, against litert-torch's recipe",
    )
    args = parser.parse_args()
    if args.quantize and not args.peer_dir:
        parser.error("--quantize: the files beside litert-torch's; pass --peer-dir")
    files = {}
    for family in args.families:
        model = lm_models.hub_causal_lm(
            HUB_FAMILY.get(family, family), seed=0, **CONFIGS[family]
        )
        distinct(model)
        for context in args.contexts:
            files[family, context] = (
                user_file(model, context, args.quantize)
                if args.peer_dir
                else write_generative(
                    cached_hub_model(model),
                    prefill_lengths=(16,),
                    max_sequence_length=context,
                )
            )
    if args.peer_dir:
        return beside_peer(files, args.peer_dir, args.rounds, args.quantize)
    # Every file's rounds interleaved, so that a change of the machine's
    # load falls on all of them alike.
    generators = {key: Generator(content) for key, content in files.items()}
    times = {key: [] for key in files}
    for _ in range(args.rounds):
        for key, generator in generators.items():
            times[key].append(decode_round(generator, args.steps))
    print("| family | context | decode ms | partitions | file MB |")
    print("|---|---|---|---|---|")
    for (family, context), content in files.items():
        print(
            f"| {family} | {context} | "
            f"{np.median(times[family, context]):.3f} | "
            f"{decode_delegation(content).partitions} | "
            f"{len(content) / 2**20:.1f} |",
            flush=True,
        )


def user_file(model, context, quantize=None):
    """The bytes of the file `to_litert_lm` writes (its weights placed after
    conversion, so that no converter fold copies a table: keras-hub's
    soft-capped tied head, divided by the cap, would otherwise hold the
    embedding twice), checked as a user's is."""
    import tempfile

    from kerasnorm.export import to_litert_lm

    path = os.path.join(tempfile.mkdtemp(), "model.tflite")
    # Random weights: their near-tied logits fail a quantized file's
    # agreement rule by chance (what the rule is for), so the agreement is
    # accepted as it comes; the mode's rms bound still holds.
    accept = None if quantize is None else 0.01
    to_litert_lm(
        model,
        path,
        max_sequence_length=context,
        prefill_lengths=(16,),
        quantize=quantize,
        min_agreement=accept,
    )
    with open(path, "rb") as f:
        return f.read()


def beside_peer(files, peer_dir, rounds, quantize=None):
    """Decode ms of each kerasnorm file and of litert-torch's file of the
    same family and context, one thread, CPU time, interleaved rounds."""
    import tempfile

    from benchmarks import machine
    from benchmarks.timing import burst_timer
    from benchmarks.timing import interleaved_medians
    from export.bench_generation import _call

    print(machine.header(), flush=True)
    work = tempfile.mkdtemp()
    candidates, sizes = {}, {}
    for (family, context), content in files.items():
        recipe = PEER_MODES[quantize]
        peer = os.path.join(peer_dir, f"{family}_{recipe}_c{context}.tflite")
        if not os.path.exists(peer):
            print(f"{family}, context {context}: no {peer}; left out", flush=True)
            continue
        ours = os.path.join(work, f"{family}_c{context}.tflite")
        with open(ours, "wb") as f:
            f.write(content)
        for exporter, path in (("kerasnorm", ours), ("litert-torch", peer)):
            key = (family, context, exporter)
            candidates[key] = burst_timer(
                _call(path, "decode", context, CONFIGS[family]["vocabulary_size"]),
                clock=time.thread_time,
            )
            sizes[key] = os.path.getsize(path) / 2**20
    medians = interleaved_medians(candidates, rounds)
    print(
        "| family | context | kerasnorm decode ms | litert-torch decode ms "
        "| ratio | kerasnorm decode partitions | MB (kerasnorm / litert-torch) |"
    )
    print("|---|---|---|---|---|---|---|")
    for family, context, exporter in candidates:
        if exporter != "kerasnorm":
            continue
        ours, theirs = (medians[family, context, e] * 1e3 for e in EXPORTERS)
        our_mb, their_mb = (sizes[family, context, e] for e in EXPORTERS)
        partitions = decode_delegation(files[family, context]).partitions
        print(
            f"| {family} | {context} | {ours:.3f} | {theirs:.3f} | "
            f"{ours / theirs:.3f} | {partitions} | "
            f"{our_mb:.1f} / {their_mb:.1f} |",
            flush=True,
        )


EXPORTERS = ("kerasnorm", "litert-torch")


if __name__ == "__main__":
    main()
