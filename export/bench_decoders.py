"""keras-hub's decoder language models at 1 x 32 tokens, float32: the file
`to_tflite` writes now (`kerasnorm.export.litert.lowering.decoder_graph`
held by the TFLite writer) against the file it wrote before (the same
export with the lowering off, what main wrote at 39b2336), side by side.

    python -m export.bench_decoders                 # ~4 min
    python -m export.bench_decoders --rounds 5      # a smoke run
    python -m export.bench_decoders --levers        # partitions, one lever off

Models: Gemma, Gemma3 (query/key norms, post norms, sliding window of 16),
Llama, Mistral, Qwen3, Phi3 and GPT-2 backbones with random weights, at
`--size small` (2 layers, hidden 32, 2 query heads and 1 key/value head of
16, MLP 64, vocabulary 256: the tests' configuration) or `medium` (4
layers, hidden 256, 4 query heads and 2 key/value heads of 64, MLP 1024,
vocabulary 4096).

Latency: LiteRT with XNNPACK on one thread (`litert.Runner`), batch 1 x 32
tokens; both files of every family timed in the same rounds, one burst
each per round in a rotating order, in the calling thread's CPU time; the
figures are medians over `--rounds` rounds. Also each file's XNNPACK
partitions and the ops left outside them.
"""

import argparse
import contextlib
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from benchmarks import machine
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import files
from kerasnorm._compat import backend_numpy_replaced
from kerasnorm._compat import new_axes_as_expand_dims
from kerasnorm.export import to_tflite
from kerasnorm.export.litert import lowering
from kerasnorm.export.tflite import write
from kerasnorm.export.verify.delegation import delegation
from tests.export import lm_models

BURST_SECONDS = 0.02
LENGTH = 32
SIZES = {
    "small": lm_models.SIZES["decoder"],
    "medium": {
        "vocabulary_size": 4096,
        "num_layers": 4,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 256,
        "intermediate_dim": 1024,
        "head_dim": 64,
    },
}
FAMILIES = ("gemma", "gemma3", "llama", "mistral", "qwen3", "phi3", "gpt2")


OPTIONS = {
    "gemma3": lm_models.GEMMA3_SLIDING,
    "gpt2": {"max_sequence_length": 2 * LENGTH},
}


def backbone(family, size):
    return lm_models.backbone(family, **SIZES[size], **OPTIONS.get(family, {}))


def tokens(vocabulary, seed):
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, vocabulary, (1, LENGTH)).astype("int32"),
        "padding_mask": np.ones((1, LENGTH), "int32"),
    }


@contextlib.contextmanager
def levers(off=()):
    """The TFLite writer's decoder lowering with the levers in `off` left
    out ("all": the file main wrote)."""

    @contextlib.contextmanager
    def graph(float_file=True):
        if "all" in off:
            yield
            return
        replaced = {
            "stack": None if "stack" in off else lowering._stack,
            "repeat": None if "repeat" in off else lowering._repeat,
            "where": None if "where" in off or not float_file else lowering._where,
        }
        axes = (
            contextlib.nullcontext() if "new_axes" in off else new_axes_as_expand_dims()
        )
        with axes, backend_numpy_replaced(**replaced):
            yield

    saved = write.decoder_graph
    write.decoder_graph = graph
    try:
        yield
    finally:
        write.decoder_graph = saved


def export(model, path, feed, off=()):
    with levers(off):
        result = to_tflite(
            model,
            path,
            batch_size=1,
            input_signature={name: (1, LENGTH) for name in model.input},
            verify_inputs=feed,
            overwrite=True,
        )
    return result


def bench(size, rounds, directory):
    timers, rows = {}, []
    for family in FAMILIES:
        keras.utils.set_random_seed(0)
        model = backbone(family, size)
        feed = tokens(SIZES[size]["vocabulary_size"], seed=1)
        want = np.asarray(model(feed, training=False))
        cells = {}
        for label, off in (("before", ("all",)), ("after", ())):
            path = os.path.join(directory, f"{family}-{label}.tflite")
            result = export(model, path, feed, off)
            content = files.read(path)
            runner = files.runner(content)
            got = runner.named(feed)
            (got,) = got.values()
            cells[label] = (
                delegation(content),
                np.max(np.abs(got - want)) / np.max(np.abs(want)),
                result.verification.passed,
            )
            timers[(family, label)] = burst_timer(
                runner.named, feed, seconds=BURST_SECONDS, clock=time.thread_time
            )
        rows.append((family, cells))
    medians = interleaved_medians(timers, rounds)
    print(f"\n{size}: batch 1 x {LENGTH} tokens, float32, XNNPACK, 1 thread,")
    print(f"median of {rounds} rounds")
    print(
        "| family | before ms | after ms | after / before | XNNPACK before "
        "| XNNPACK after | max error after |"
    )
    print("|---|---:|---:|---:|---|---|---:|")
    for family, cells in rows:
        before, after = medians[(family, "before")], medians[(family, "after")]
        print(
            f"| {family} | {1e3 * before:.3f} | {1e3 * after:.3f} | "
            f"{after / before:.2f} | {cells['before'][0]} | {cells['after'][0]} | "
            f"{cells['after'][1]:.1e} |"
        )


def bench_levers(size, directory):
    """Partitions at 1 x 32 with each lever off in turn."""
    print(f"\n{size}: XNNPACK partitions at 1 x {LENGTH}, float32, one lever off")
    print("| family | all levers | no stack | no repeat | no where | none |")
    print("|---|---|---|---|---|---|")
    for family in FAMILIES:
        keras.utils.set_random_seed(0)
        model = backbone(family, size)
        feed = tokens(SIZES[size]["vocabulary_size"], seed=1)
        cells = []
        for off in ((), ("stack",), ("repeat",), ("where",), ("all",)):
            path = os.path.join(directory, f"{family}-levers.tflite")
            export(model, path, feed, off)
            split = delegation(path)
            cells.append(f"{split.partitions} ({split.undelegated_ops} outside)")
        print(f"| {family} | " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--levers", action="store_true")
    args = parser.parse_args()
    print(machine.header(load_tensorflow=True))
    with tempfile.TemporaryDirectory() as directory:
        if args.levers:
            bench_levers(args.size, directory)
        else:
            bench(args.size, args.rounds, directory)


if __name__ == "__main__":
    main()
