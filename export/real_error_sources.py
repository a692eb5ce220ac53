"""Where a real decoder's int8 error comes from, measured in Keras.

Each linear layer of a keras-hub Llama-family or Gemma 3 CausalLM (query/key/value,
attention output, gate/up, down, the tied head) is run with its input
fake-quantized the way `"dynamic"` files quantize it at run time (int8 per
row, asymmetric: XNNPACK's dynamic-range `FULLY_CONNECTED`) or its kernel
rounded the way the weights pass rounds it (symmetric int8 per output
channel; the embedding table per row, which a tied head shares), one kind
at a time, then all together. Each run is compared with the float model on
a fixed English paragraph, teacher-forced (one forward pass over the whole
paragraph): top-1 agreement and the perplexity ratio.

    PYTHONPATH=$PWD python -m export.real_error_sources [--smooth] [--rotate]
        [--int8-blocks B ...]

`--smooth` first smooths the model as `to_litert_lm` does by default
(`fold.smooth.smooth` on the check's English sentences, the strength
searched against the products' int8 weights, the gated feed-forwards'
down products too), then measures.

`--rotate` measures instead what rotating each product's input would buy
`"dynamic"` (QuaRot, arXiv 2404.00456; SpinQuant): the input `x` of
`x @ W` rounded per row as `x Q` (`Q` orthogonal, the Kronecker product of
two seeded random orthogonal matrices, as an online rotation would apply
it cheaply), the kernel as `Q^T W` rounded per output channel; in float
the product is unchanged. "gain folded": the readers of a norm see its
output before the gain (folded into `W`), as a rotation of the residual
stream done offline would have them. Each run also reports the mean KL
divergence from the float model per step (nats).

`--int8-blocks B [B ...]` measures what finer weight-only scales would
buy: every kernel and the table rounded to int8 with one scale per block
of `B` inputs of each output channel (each block costs a float32 scale in
a file), beside one scale per channel, on the paragraph and, with
`--held-out FILE [--held-out-from TEXT]`, on the held-out pieces
`real_quality` scores files on (pooled by their steps).
"""

from __future__ import annotations

import argparse
import contextlib

import keras
import numpy as np

from kerasnorm._compat.keras_hub_blocks import BLOCKS


def fake_int8_rows(x, axes=1):
    """`x` rounded as a dynamic-range product rounds its input: int8 per
    row (the last `axes` axes), asymmetric, zero exactly representable."""
    x = keras.ops.convert_to_tensor(x)
    shape = keras.ops.shape(x)
    rows = keras.ops.reshape(x, (-1, int(np.prod(x.shape[-axes:]))))
    low = keras.ops.minimum(keras.ops.min(rows, axis=-1, keepdims=True), 0.0)
    high = keras.ops.maximum(keras.ops.max(rows, axis=-1, keepdims=True), 0.0)
    step = keras.ops.maximum((high - low) / 255.0, 1e-12)
    zero = keras.ops.round(-128.0 - low / step)
    q = keras.ops.clip(keras.ops.round(rows / step) + zero, -128.0, 127.0)
    return keras.ops.reshape((q - zero) * step, shape)


def int8_channels(kernel, input_axes, block=None):
    """`kernel` rounded to symmetric int8 with one scale per output channel
    (every axis but `input_axes`), or with `block` one per block of that
    many inputs of each channel."""
    k = np.asarray(kernel, np.float64)
    if block is not None:
        first = range(len(input_axes))
        t = np.moveaxis(k, input_axes, first)
        rows = t.reshape(-1, block, *t.shape[len(input_axes) :])
        rows = int8_channels(rows, (1,)).reshape(t.shape)
        return np.moveaxis(rows, first, input_axes)
    top = np.abs(k).max(axis=tuple(input_axes), keepdims=True) / 127.0
    top = np.where(top > 0, top, 1.0)
    return (np.round(k / top) * top).astype(np.float32)


def linear_kinds(model):
    """`{kind: [(layer, input axes of its kernel, input axes of x)]}` of a
    keras-hub decoder: the block table's norm readers (`qkv`, `gate_up`),
    the attention output (`o`), the feed-forward output (`down`)."""
    kinds = {"qkv": [], "o": [], "gate_up": [], "down": []}
    for block in model.backbone.transformer_layers:
        (_, qkv), (_, gate_up) = BLOCKS[type(block).__name__]
        gemma = hasattr(block, "ffw_linear")
        output = (
            "attention.output_dense" if gemma else "_self_attention_layer._output_dense"
        )
        down = "ffw_linear" if gemma else "_feedforward_output_dense"
        for kind, paths in (("qkv", qkv), ("o", [output]), ("gate_up", gate_up)):
            kinds[kind] += [_entry(_at(block, path)) for path in paths]
        kinds["down"].append(_entry(_at(block, down)))
    return kinds


def kernel_input_axes(layer):
    """The axes of `layer`'s kernel its input is summed over: `(0,)` for a
    `Dense`; an `EinsumDense`'s from its equation (Gemma's query kernel
    `NDH` sums over axis 1, an attention output's `NHD` over 0 and 1)."""
    equation = getattr(layer, "equation", None)
    if equation is None:
        return (0,)
    inputs, out = equation.split("->")
    x, kernel = inputs.split(",")
    summed = set(x) & set(kernel) - set(out)
    return tuple(i for i, c in enumerate(kernel) if c in summed)


def _entry(layer):
    axes = kernel_input_axes(layer)
    return layer, axes, len(axes)


def _at(layer, path):
    for name in path.split("."):
        layer = getattr(layer, name)
    return layer


@contextlib.contextmanager
def quantized_inputs(layers):
    """Each of `layers` (`(layer, kernel axes, input axes)`) reads its
    input rounded per row."""
    for layer, _, axes in layers:
        call = layer.call
        layer.call = lambda x, *a, _c=call, _n=axes, **k: _c(
            fake_int8_rows(x, _n), *a, **k
        )
    try:
        yield
    finally:
        for layer, _, _ in layers:
            del layer.call


@contextlib.contextmanager
def quantized_kernels(layers, block=None):
    saved = [(layer.kernel, layer.kernel.numpy()) for layer, _, _ in layers]
    for layer, axes, _ in layers:
        layer.kernel.assign(int8_channels(layer.kernel.numpy(), axes, block))
    try:
        yield
    finally:
        for variable, value in saved:
            variable.assign(value)


@contextlib.contextmanager
def quantized_table(model, block=None):
    table = model.backbone.token_embedding.embeddings
    saved = table.numpy()
    table.assign(int8_channels(saved, (1,), block))
    try:
        yield
    finally:
        table.assign(saved)


@contextlib.contextmanager
def quantized_head_input(model):
    embedding = model.backbone.token_embedding
    call = embedding.call

    def rounded(inputs, reverse=False):
        return call(fake_int8_rows(inputs) if reverse else inputs, reverse=reverse)

    embedding.call = rounded
    try:
        yield
    finally:
        del embedding.call


def logits(model, ids):
    x = np.asarray([ids], np.int32)
    out = model({"token_ids": x, "padding_mask": np.ones_like(x, bool)}, training=False)
    return np.asarray(out, np.float64)[0, :-1]


def score(reference, got, ids):
    from tests.support.real_models import log_softmax

    def nll(z):
        return -log_softmax(z)[np.arange(len(z)), ids[1:]].mean()

    agreement = float(np.mean(reference.argmax(-1) == got.argmax(-1)))
    return agreement, float(np.exp(nll(got) - nll(reference)))


def orthogonal(n, seed):
    """A seeded `n x n` orthogonal matrix: the Kronecker product of two
    random orthogonal factors of sizes near `sqrt(n)`."""

    def factor(size, seed):
        q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((size, size)))
        return q * np.sign(np.diag(r))

    a = int(np.sqrt(n))
    while n % a:
        a -= 1
    return np.kron(factor(a, seed), factor(n // a, seed + 1)).astype(np.float32)


def norm_gains(model):
    """`{id(product layer): gain}` of each norm reader (its norm's gain,
    `1 + scale` for Gemma's)."""
    from kerasnorm._compat.keras_hub_blocks import ONE_PLUS_SCALE

    gains = {}
    for block in model.backbone.transformer_layers:
        for norm_path, readers in BLOCKS[type(block).__name__]:
            norm = _at(block, norm_path)
            g = np.asarray(norm.scale if hasattr(norm, "scale") else norm.gamma)
            g = g.astype(np.float32) + (type(norm).__name__ in ONE_PLUS_SCALE)
            gains.update({id(_at(block, path)): g for path in readers})
    return gains


@contextlib.contextmanager
def rotated(layers, gains, *, rotate=True, inputs=True, kernels=True, skip=()):
    """Each of `layers` computing `x @ W` as `round_rows(x' Q) @
    round_channels(Q^T W')`, `x' = x / g`, `W' = g W` where `gains` has
    the layer's norm gain `g` (else 1): `inputs` and `kernels` say which
    are rounded; `Q` the identity for a layer in `skip` or without
    `rotate`."""
    saved = []
    for i, (layer, kernel_axes, x_axes) in enumerate(layers):
        k = layer.kernel.numpy()
        first = range(len(kernel_axes))
        t = np.moveaxis(k, kernel_axes, first)  # the input axes first
        n = int(np.prod(t.shape[: len(kernel_axes)]))
        q = np.eye(n, dtype=np.float32)
        if rotate and id(layer) not in skip:
            q = orthogonal(n, 7 * i)
        g = gains.get(id(layer), np.ones(n, np.float32))
        w = q.T @ (g[:, None] * t.reshape(n, -1))
        w = int8_channels(w, (0,)) if kernels else w
        saved.append((layer.kernel, k))
        t = ((q @ w) / g[:, None]).reshape(t.shape)
        layer.kernel.assign(np.moveaxis(t, first, kernel_axes))
        if inputs:
            layer.call = _rotated_call(layer.call, x_axes, q, g)
    try:
        yield
    finally:
        for (layer, _, _), (variable, value) in zip(layers, saved, strict=False):
            variable.assign(value)
            if inputs:
                del layer.call


def _rotated_call(call, axes, q, g):
    q, g = keras.ops.convert_to_tensor(q), keras.ops.convert_to_tensor(g)

    def rounded(x, *args, **kwargs):
        shape = keras.ops.shape(x)
        rows = keras.ops.reshape(x, (-1, q.shape[0])) / g
        rows = fake_int8_rows(keras.ops.matmul(rows, q))
        back = keras.ops.matmul(rows, keras.ops.transpose(q)) * g
        return call(keras.ops.reshape(back, shape), *args, **kwargs)

    return rounded


def measure_rotations(model, ids):
    """`{run: (agreement, perplexity ratio, KL)}` of `"dynamic"` (every
    product's weights and input rounded, the table per row, the head's
    input per row) with and without rotated inputs."""
    kinds = linear_kinds(model)
    every = [entry for layers in kinds.values() for entry in layers]
    down = {id(layer) for layer, _, _ in kinds["down"]}
    gains, none = norm_gains(model), {}
    reference = logits(model, ids)
    runs = {
        "no rotation": ({"rotate": False}, none),
        "rotated, gain kept (online)": ({}, none),
        "rotated, gain folded": ({}, gains),
        "rotated, gain folded, down not rotated": ({"skip": down}, gains),
        "inputs only, no rotation": ({"rotate": False, "kernels": False}, none),
        "inputs only, rotated, gain folded": ({"kernels": False}, gains),
        "weights only, no rotation": ({"rotate": False, "inputs": False}, none),
        "weights only, rotated, gain folded": ({"inputs": False}, gains),
    }
    from export.real_quality import kl_divergence

    scores = {}
    for name, (options, g) in runs.items():
        with rotated(every, g, **options), quantized_table(model):
            with quantized_head_input(model):
                got = logits(model, ids)
        scores[name] = (*score(reference, got, ids), kl_divergence(reference, got))
    return scores


def measure(model, ids):
    kinds = linear_kinds(model)
    reference = logits(model, ids)
    runs = {}
    for kind, layers in kinds.items():
        with quantized_inputs(layers):
            runs[f"input of {kind} (dynamic int8 per row)"] = logits(model, ids)
    with quantized_head_input(model):
        runs["input of head (dynamic int8 per row)"] = logits(model, ids)
    for kind, layers in kinds.items():
        with quantized_kernels(layers):
            runs[f"weights of {kind} (int8 per channel)"] = logits(model, ids)
    with quantized_table(model):
        runs["embedding table and tied head (int8 per row)"] = logits(model, ids)
    every = [entry for layers in kinds.values() for entry in layers]
    with quantized_kernels(every), quantized_table(model):
        runs["all weights (weight_only_int8)"] = logits(model, ids)
        with quantized_inputs(every), quantized_head_input(model):
            runs["all weights and inputs (dynamic)"] = logits(model, ids)
    return {name: score(reference, got, ids) for name, got in runs.items()}


def measure_blocks(model, texts, blocks):
    """`{block: [(agreement, perplexity ratio, KL) per text]}` of the
    weights alone rounded as `"weight_only_int8"` rounds them (every
    kernel, the table and the tied head; no input rounded), with one int8
    scale per output channel (`None`) or per `block` inputs of it: what
    finer scales would buy, each costing a float32 scale per block."""
    from export.real_quality import kl_divergence

    every = [entry for layers in linear_kinds(model).values() for entry in layers]
    # float32, one text at a time: Gemma's rows are 262,144 wide.
    references = [logits(model, ids).astype(np.float32) for ids in texts]
    scores = {}
    for block in blocks:
        scores[block] = []
        with quantized_kernels(every, block), quantized_table(model, block):
            for kept, ids in zip(references, texts, strict=True):
                got, reference = logits(model, ids), kept.astype(np.float64)
                scores[block].append(
                    (*score(reference, got, ids), kl_divergence(reference, got))
                )
    return scores


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "gemma3"))
    parser.add_argument("--smooth", action="store_true")
    parser.add_argument("--rotate", action="store_true")
    parser.add_argument("--int8-blocks", type=int, nargs="+", metavar="B")
    parser.add_argument("--held-out", metavar="FILE", help="--int8-blocks: text")
    parser.add_argument("--held-out-from", default="", metavar="TEXT")
    args = parser.parse_args(argv)
    from tests.support import real_models

    real = real_models.load(args.model)
    model, ids = real.model, real.ids(real_models.PARAGRAPH)
    if args.smooth:
        _smooth(model)
    print(f"{args.model}: {len(ids)} tokens, teacher-forced against float32")
    if args.int8_blocks:
        from export.real_quality import held_out_ids

        held = args.held_out and held_out_ids(real, args.held_out, args.held_out_from)
        texts = [ids, *(held or [])]
        steps = np.asarray([len(t) - 1 for t in texts[1:]], np.float64)
        print(f"held-out: {int(steps.sum())} steps in {len(steps)} pieces")
        print("| int8 scales | paragraph: agreement / ppl ratio / KL | held-out |")
        print("|---|---|---|")
        blocks = [None, *args.int8_blocks]
        for block, rows in measure_blocks(model, texts, blocks).items():
            (a, p, k), held = rows[0], np.asarray(rows[1:]).reshape(-1, 3)
            pooled = steps @ held[:, [0, 2]] / steps.sum() if len(held) else ()
            held_cell = " / ".join(f"{v:.5f}" for v in pooled) or "-"
            name = "per channel" if block is None else block
            print(f"| {name} | {a:.4f} / {p:.4f}x / {k:.5f} | {held_cell} |")
        return
    if args.rotate:
        print('| "dynamic", rounded | top-1 agreement | perplexity ratio | KL |')
        print("|---|---|---|---|")
        for name, (agreement, ratio, nats) in measure_rotations(model, ids).items():
            print(f"| {name} | {agreement:.3f} | {ratio:.4f} | {nats:.5f} |")
        return
    print("| rounded | top-1 agreement | perplexity ratio |")
    print("|---|---|---|")
    for name, (agreement, ratio) in measure(model, ids).items():
        print(f"| {name} | {agreement:.3f} | {ratio:.4f} |")


def _smooth(model):
    from kerasnorm.export.fold import smooth
    from kerasnorm.export.litert_lm.prompts import VERIFY_TEXTS

    tokenizer = model.preprocessor.tokenizer
    ids = [int(i) for t in VERIFY_TEXTS for i in np.asarray(tokenizer(t))]
    tokens = np.asarray([ids], np.int32)
    data = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
    done, _ = smooth.smooth(model, data, activations=smooth.FLOAT, gated=True)
    print(f"{len(done)} sites smoothed")


if __name__ == "__main__":
    main()
