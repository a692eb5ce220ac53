"""Where `quantize="int4"` loses a real checkpoint's greedy choices:
the keras-hub model's products fake-quantized in NumPy one group at a
time, scored teacher-forced on the fixed paragraph against the float model
(tests/support/real_models.py).

Each product (`Dense`, `EinsumDense`, and the tied head) gets its weights
rounded as the file stores them (`kerasnorm.export.weights.int_weights`:
int4 in blocks along the input dimension, int8 per output channel) and,
where the file's kernel quantizes its input per call, its input rounded to
int8 per row (asymmetric, as XNNPACK's dynamic-range kernels do). The
embedding table is rounded for its lookup and, tied, for the head.

    PYTHONPATH=$PWD python -m export.int4_error --model smollm2 [--perturb]

Prints one row per configuration: top-1 agreement with the float model on
the paragraph's steps and the perplexity ratio.
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np

from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm.export.weights import int_weights
from tests.support import real_models

PROMPT = 39


# ----------------------------------------------------------- the products


class Product:
    """One `Dense`/`EinsumDense` of the model as an `(out, in)` matrix."""

    def __init__(self, layer, group, index, count):
        self.layer, self.group = layer, group
        self.index, self.count = index, count  # its block and how many
        kernel = layer.kernel
        self.shape = tuple(kernel.shape)
        if isinstance(layer, keras.layers.EinsumDense):
            x, rest = layer.equation.split(",")
            w = rest.split("->")[0]
            self.inputs = [i for i, c in enumerate(w) if c in x]
        else:
            self.inputs = [0]
        self.outputs = [i for i in range(len(self.shape)) if i not in self.inputs]
        self.float = self.matrix(np.asarray(kernel.numpy(), np.float32))

    def matrix(self, kernel):
        order = self.outputs + self.inputs
        out = int(np.prod([self.shape[i] for i in self.outputs]))
        return np.transpose(kernel, order).reshape(out, -1)

    def assign(self, matrix):
        order = self.outputs + self.inputs
        dims = [self.shape[i] for i in order]
        kernel = np.transpose(matrix.reshape(dims), np.argsort(order))
        self.layer.kernel.assign(kernel.astype(np.float32))


def products(model):
    """The model's products in order, each with its group name (attention,
    mlp) and the index of its transformer block."""
    backbone = model.backbone
    blocks = [
        layer
        for layer in backbone.layers
        if layer.name.startswith("transformer_layer_")
    ]
    found = []
    for i, block in enumerate(blocks):
        for layer in block._flatten_layers(include_self=False):
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
                path = layer.path
                group = "attention" if "attention" in path else "mlp"
                found.append(Product(layer, group, i, len(blocks)))
    return found


# -------------------------------------------------------------- rounding


def int4_sym(w, block):
    q, scale = int_weights.int4_blocks(w, block)
    steps = np.repeat(scale.astype(np.float32), block, axis=1)
    return q.astype(np.float32) * steps


def int8_channel(w):
    q, scale = int_weights.int8_rows(w)
    return q.astype(np.float32) * scale[:, None]


def int8_activations(x):
    """Per row (token), asymmetric int8: XNNPACK's dynamic quantization."""
    x = np.asarray(x, np.float32)
    low = np.minimum(x.min(-1, keepdims=True), 0)
    high = np.maximum(x.max(-1, keepdims=True), 0)
    scale = np.where(high > low, (high - low) / 255.0, 1.0)
    zero = np.rint(-128 - low / scale)
    q = np.clip(np.rint(x / scale) + zero, -128, 127)
    return ((q - zero) * scale).astype(np.float32)


def int4_gptq(w, block, hessian):
    q, scale = int_weights.int4_blocks_gptq(w, hessian, block)
    steps = np.repeat(scale.astype(np.float32), block, axis=1)
    return q.astype(np.float32) * steps


WEIGHTS = {
    "float": lambda w, block, h: w,
    "int8": lambda w, block, h: int8_channel(w),
    "int4": lambda w, block, h: int4_sym(w, block),
    "gptq": int4_gptq,
}

# Calibration text for GPTQ, not the scored paragraph.
CALIBRATION = (
    "The committee met on Tuesday to discuss the budget for the coming "
    "year. Most members agreed that the library needed a new roof, but "
    "they could not decide whether to pay for it by raising fees or by "
    "cutting the hours of the swimming pool. After a long debate, they "
    "asked the treasurer to prepare both plans and to present them at the "
    "next meeting, together with an estimate of how many people use each "
    "service. What is the capital of France? Paris is the capital and the "
    "largest city of France. Write a short poem about the sea. The waves "
    "roll in and out again, under a sky of gray and rain."
)


# ----------------------------------------------------------- the harness


class Harness:
    def __init__(self, real):
        self.real = real
        self.model = real.model
        self.ids = real.ids(real_models.PARAGRAPH)
        self.products = products(self.model)
        self.embedding = self.model.backbone.token_embedding
        self.table = np.asarray(self.embedding.embeddings.numpy(), np.float32)
        self.tied = getattr(self.embedding, "tie_weights", True)
        self.ref = self.logits()
        self.targets = self.ids[PROMPT:]
        self.ppl = real_models.perplexity(self.ref, self.targets)
        self._patched = []
        self.hessians = {}

    def calibrate(self, sequences):
        """Each product's (and the head's) sum of `x x^T` over its inputs
        when the float model reads `sequences`."""
        sums = {}

        def hook(key, layer, flatten, reverse_only=False):
            original = layer.call

            def call(inputs, *args, **kwargs):
                if not reverse_only or kwargs.get("reverse", False):
                    x = np.asarray(inputs, np.float64)
                    x = x.reshape(-1, int(np.prod(x.shape[x.ndim - flatten :])))
                    sums[key] = sums.get(key, 0.0) + x.T @ x
                return original(inputs, *args, **kwargs)

            replace_method(layer, "call", call)
            return layer

        hooked = [hook(p.layer.path, p.layer, len(p.inputs)) for p in self.products]
        hooked.append(hook("head", self.embedding, 1, reverse_only=True))
        try:
            for ids in sequences:
                real_models.forward_logits(self.real, ids)
        finally:
            for layer in hooked:
                restore_method(layer, "call", None)
        self.hessians = sums

    def logits(self):
        return real_models.forward_logits(self.real, self.ids)[PROMPT - 1 : -1]

    def _quantize_inputs(self, layer, reverse_only=False):
        original = layer.call

        def call(inputs, *args, **kwargs):
            if reverse_only and not kwargs.get("reverse", False):
                return original(inputs, *args, **kwargs)
            return original(int8_activations(inputs), *args, **kwargs)

        replace_method(layer, "call", call)
        self._patched.append(layer)

    def score(
        self, product_mode, table_mode="int4", block=32, acts=True, head_acts=None
    ):
        """`product_mode(product) -> "float" | "int8" | "int4"`."""
        head_acts = acts if head_acts is None else head_acts
        try:
            for p in self.products:
                mode = product_mode(p)
                p.assign(WEIGHTS[mode](p.float, block, self.hessians.get(p.layer.path)))
                if acts:
                    self._quantize_inputs(p.layer)
            table = WEIGHTS[table_mode](self.table, block, self.hessians.get("head"))
            self.embedding.embeddings.assign(table)
            if head_acts:
                self._quantize_inputs(self.embedding, reverse_only=True)
            rows = self.logits()
        finally:
            for layer in self._patched:
                restore_method(layer, "call", None)
            self._patched = []
            for p in self.products:
                p.assign(p.float)
            self.embedding.embeddings.assign(self.table)
        agreement = float(np.mean(rows.argmax(-1) == self.ref.argmax(-1)))
        ratio = real_models.perplexity(rows, self.targets) / self.ppl
        return agreement, ratio


CONFIGS = {
    "GPTQ int4 (products + table)": dict(
        product_mode=lambda p: "gptq", table_mode="gptq"
    ),
    "GPTQ int4 products, table int4": dict(
        product_mode=lambda p: "gptq", table_mode="int4"
    ),
    "float weights, int8 activations everywhere": dict(
        product_mode=lambda p: "float", table_mode="float", acts=True
    ),
    "dynamic (int8 weights, int8 activations)": dict(
        product_mode=lambda p: "int8", table_mode="int8"
    ),
    "int8 weights, float activations": dict(
        product_mode=lambda p: "int8", table_mode="int8", acts=False
    ),
    "int4 (products + table), int8 activations": dict(
        product_mode=lambda p: "int4", table_mode="int4"
    ),
    "int4 (products + table), float activations": dict(
        product_mode=lambda p: "int4", table_mode="int4", acts=False
    ),
    "int4 products, table int8": dict(product_mode=lambda p: "int4", table_mode="int8"),
    "int4 products, table float (head float)": dict(
        product_mode=lambda p: "int4", table_mode="float"
    ),
    "int4 table only (products int8)": dict(
        product_mode=lambda p: "int8", table_mode="int4"
    ),
    "int4 attention only (rest int8)": dict(
        product_mode=lambda p: "int4" if p.group == "attention" else "int8",
        table_mode="int8",
    ),
    "int4 MLP only (rest int8)": dict(
        product_mode=lambda p: "int4" if p.group == "mlp" else "int8",
        table_mode="int8",
    ),
    "int4 products, first and last 2 blocks int8, table int8": dict(
        product_mode=lambda p: (
            "int8" if p.index < 2 or p.index >= p.count - 2 else "int4"
        ),
        table_mode="int8",
    ),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "gemma3"))
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument(
        "--calibration",
        default="text",
        choices=("text", "random"),
        help="GPTQ's calibration: a paragraph of other text, or random ids",
    )
    args = parser.parse_args(argv)
    start = time.time()
    real = real_models.load(args.model, perturb=args.perturb)
    harness = Harness(real)
    print(
        f"{args.model}{' (perturbed)' if args.perturb else ''}, block {args.block}: "
        f"{len(harness.targets)} steps, float perplexity {harness.ppl:.2f} "
        f"(loaded in {time.time() - start:.0f} s)"
    )
    if args.calibration == "text":
        sequences = [real.ids(CALIBRATION)]
    else:
        rng = np.random.default_rng(0)
        vocabulary = harness.table.shape[0]
        sequences = [rng.integers(0, vocabulary, 64).tolist() for _ in range(4)]
    harness.calibrate(sequences)
    print("| configuration | agreement | perplexity ratio |\n|---|---|---|")
    for name, config in CONFIGS.items():
        if args.only and not any(s in name for s in args.only):
            continue
        agreement, ratio = harness.score(block=args.block, **config)
        print(f"| {name} | {agreement:.3f} | {ratio:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
