"""Where an embedding bundle's `quantize="int4"` loses cosine similarity:
the tests' tiny keras-hub TextEmbedders (`tests/export/embedder_models.py`)
written as `to_litert_embedder` writes their TEXT_ENCODER, with one group
of products at a time kept at int8 per channel (dynamic range, as
`"dynamic"` writes them) while the rest are int4, and the other way round.

Each file is the export's own: the float32 encoder converted once, its
weights quantized by the export's pass (`weights.quantize`, GPTQ fitted to
`prompts.CALIBRATION_TEXTS` as the export fits it), run by the LiteRT
interpreter; each row is the least cosine similarity with the Keras
embedder over the export's five check sentences at each length. The
groups are the products of the attention's query, key, value and output,
the feed-forward's, the pooling's projections (the products after the
blocks) and the token table (int4 blocks against int8 rows). Layers of
equal weights (an untrained model's key and value) are one product in the
file: such a product goes with each of its layers' groups.

    PYTHONPATH=$PWD python -m export.embedder_int4_error
        # --families gemma3 qwen3 bert --seeds 0 1 2 --lengths 8 16 32
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile

import numpy as np

from kerasnorm._compat import sublayers
from kerasnorm.export.litert_lm import embedding_graph as graph
from kerasnorm.export.litert_lm.embedder import SAMPLE_SENTENCES
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import INT4_BLOCKS
from kerasnorm.export.options.generative_modes import INT8_ROWS
from kerasnorm.export.weights.calibration import Calibration
from kerasnorm.export.weights.calibration import products_of_layers
from kerasnorm.export.weights.quantize import quantize_weights

GROUPS = ("query", "key", "value", "attention output", "feed-forward", "pooling")


def group_of(path):
    """The group of a product's layer path."""
    if "/" not in path:
        return "pooling"  # the embedder's own layers, after the backbone
    name = path.rsplit("/", 1)[-1]
    if name in ("query", "key", "value"):
        return name
    return "attention output" if name == "attention_output" else "feed-forward"


class Bench:
    """One embedder: its float32 encoder, calibration and references."""

    def __init__(self, family, seed, lengths):
        from tests.export import embedder_models

        self.lengths = lengths
        self.directory = tempfile.TemporaryDirectory(prefix="embedder_int4_")
        folder = embedder_models.directory_for(self.directory.name)
        self.embedder = embedder_models.text_embedder(family, folder, seed=seed)
        tokenizer = graph.keras_tokenizer(self.embedder)
        self.special = graph.special_tokens(tokenizer)
        bos, eos, pad = self.special
        ids = [
            np.asarray(tokenizer(t)).reshape(-1).astype(int).tolist()
            for t in SAMPLE_SENTENCES
        ]
        self.rows = {t: [graph.pack(r, t, bos, eos) for r in ids] for t in lengths}
        self.expected = {
            t: graph.keras_embeddings(self.embedder, rows, t, pad)
            for t, rows in self.rows.items()
        }
        module, functions = graph.encoder_module(self.embedder, lengths)
        self.content = graph.convert(module, functions, False)
        self.calibration = graph.calibration_inputs(
            self.embedder, tokenizer, self.special, lengths[-1]
        )
        names = {layer.name for layer in sublayers(self.embedder, recursive=True)}
        self.groups = {g: set() for g in GROUPS}
        for key, paths in products_of_layers(self.embedder, names).items():
            for path in paths:
                self.groups[group_of(path)].add(key)

    def cosines(self, mode="int4", int8=(), table=INT8_ROWS, gptq=True):
        """Least cosine at each length of the file with `int8` (weights
        keys) at int8 per channel, the table as `table`."""
        row = GENERATIVE_MODES[mode]
        calibration = None
        if mode == "int4":
            row = dataclasses.replace(row, lookup=table)
            calibration = Calibration(self.calibration if gptq else {})
            calibration.int8.update(int8)
        content = quantize_weights(self.content, row, 32, calibration=calibration)
        return [
            float(np.min(graph.cosine(graph.file_embeddings(content, rows, t), want)))
            for (t, rows), want in zip(
                self.rows.items(), self.expected.values(), strict=True
            )
        ]


def rows_of(bench):
    everything = set().union(*bench.groups.values())
    policy = {k for g in ("value", "attention output") for k in bench.groups[g]}
    yield "dynamic (int8 products and table)", bench.cosines("dynamic")
    yield "int4, table int8 rows (before)", bench.cosines()
    yield "int4 rounded to nearest, table int8", bench.cosines(gptq=False)
    yield "int4, table int4 blocks", bench.cosines(table=INT4_BLOCKS)
    for group in GROUPS:
        if bench.groups[group]:
            yield (
                f"{group} int8, the rest int4",
                bench.cosines(int8=bench.groups[group]),
            )
    for group in GROUPS:
        if bench.groups[group]:
            rest = everything - bench.groups[group]
            yield f"only {group} int4", bench.cosines(int8=rest)
    yield "value + attention output int8 (the export)", bench.cosines(int8=policy)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--families",
        nargs="+",
        default=["gemma3", "qwen3", "bert"],
        choices=["gemma3", "qwen3", "bert", "xlm_roberta"],
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--lengths", nargs="+", type=int, default=[8, 16, 32])
    args = parser.parse_args(argv)
    lengths = tuple(sorted(args.lengths))
    heads = " | ".join(f"length {t}" for t in lengths)
    for family in args.families:
        for seed in args.seeds:
            bench = Bench(family, seed, lengths)
            print(f"\n{family}, seed {seed}: least cosine with Keras\n")
            print(f"| file | {heads} | least |")
            print("|---|" + "---|" * (len(lengths) + 1))
            for name, values in rows_of(bench):
                cells = " | ".join(f"{v:.4f}" for v in values)
                print(f"| {name} | {cells} | {min(values):.4f} |", flush=True)
            bench.directory.cleanup()


if __name__ == "__main__":
    main()
