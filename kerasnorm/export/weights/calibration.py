"""What GPTQ's rounding (`int_weights.int4_blocks_gptq`) calibrates on: the
inputs each product of a Keras model reads on calibration sequences, keyed
by the product's float32 `(out, in)` weights' content
(`int_weights.weights_key`), as the weights pass finds its products in the
file. The inputs are kept, not their `x x^T`: a few hundred rows of `in`
values are smaller than `in x in` once `in` passes them (a 1B model's
feed-forward reads 8192).

The products are the model's `Dense` and `EinsumDense` layers (their
kernels flattened to `(out, in)` as the file's `FULLY_CONNECTED` holds
them: the einsum's contracted axes are the input) and an embedding's
reverse product, the head (keras-hub's `ReversibleEmbedding` with
`reverse=True`: its table `(vocab, hidden)` when tied, else the reverse
embeddings transposed). Each layer's `call` is replaced on the instance
while `run` runs (`_compat.replace_method`), and restored after. Layers of
equal weights (an untrained model's key and value, or query and output,
initialized alike) are one tensor in the file, rounded once: their key
holds each layer's rows, scaled to the same mean square. A product the
file computes for several layers that read one input (`fused`: the
query, key and value as one) is keyed by its concatenated weights and
holds the rows its first layer reads (GPTQ's Hessian is the input's).
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm._compat import sublayers
from kerasnorm.export.weights.int_weights import weights_key


def _inputs_of(layer):
    """How many trailing axes of `layer`'s input its kernel contracts, and
    its float32 `(out, in)` weights; None for a layer with no product."""
    kernel = getattr(layer, "kernel", None)
    if isinstance(layer, keras.layers.EinsumDense) and kernel is not None:
        x, rest = layer.equation.split(",")
        w = rest.split("->")[0]
        inputs = [i for i, c in enumerate(w) if c in x]
        outputs = [i for i in range(len(w)) if i not in inputs]
        k = np.asarray(kernel.numpy(), np.float32)
        out = int(np.prod([k.shape[i] for i in outputs]))
        return len(inputs), np.transpose(k, outputs + inputs).reshape(out, -1)
    if isinstance(layer, keras.layers.Dense) and kernel is not None:
        return 1, np.asarray(kernel.numpy(), np.float32).T
    return None


def _head_of(layer):
    """An embedding's reverse product `(vocab, hidden)`, or None."""
    if not hasattr(layer, "tie_weights") or not isinstance(
        layer, keras.layers.Embedding
    ):
        return None
    if layer.tie_weights:
        return np.asarray(layer.embeddings.numpy(), np.float32)
    reverse = getattr(layer, "reverse_embeddings", None)
    return None if reverse is None else np.asarray(reverse.numpy(), np.float32).T


class Calibration(dict):
    """`{weights_key: (rows, in) float32}`, and `rounded`: the weights pass
    appends each product it rounds on them (`edits.Rounded`); `int8`: the
    `weights_key`s of products the caller keeps at int8 per output channel
    (dynamic range) in an int4 file (`products_of_layers`)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rounded = []
        self.int8 = set()


def products_of_layers(model, names):
    """`{weights_key: layer paths}` of the products of `model`'s layers named
    one of `names`, each with every layer of its weights (layers of equal
    weights are one product in the file)."""
    layers = {}
    for layer in sublayers(model, recursive=True):
        product = _inputs_of(layer)
        if product is not None:
            layers.setdefault(weights_key(product[1]), []).append(layer)
    return {
        key: tuple(dict.fromkeys(layer.path for layer in found))
        for key, found in layers.items()
        if any(layer.name in names for layer in found)
    }


def product_inputs(model, sequences, run, fused=(), tied_heads=True):
    """`Calibration`: each product's inputs, one row per position, while
    `run(ids)` runs `model` on each of `sequences`; `fused`: `(weights_key,
    layer)` of each product of several layers that read one input, `layer`
    the first of them; `tied_heads`: a tied head's too (its weights are the
    table its lookup reads)."""
    rows, hooked, keys = {}, [], {}

    def hook(layer, key, axes, reverse_only):
        original = layer.call
        # What the instance held (another pass's replacement, as a smoothed
        # head's lookup): put back as it was, not dropped.
        hooked.append((layer, layer.__dict__.get("call")))

        def call(inputs, *args, **kwargs):
            if not reverse_only or kwargs.get("reverse", False):
                x = np.asarray(inputs, np.float32)
                x = x.reshape(-1, int(np.prod(x.shape[x.ndim - axes :])))
                rows.setdefault(key, {}).setdefault(id(layer), []).append(x)
            return original(inputs, *args, **kwargs)

        replace_method(layer, "call", call)

    seen = set()
    for layer in sublayers(model, recursive=True):
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        product = _inputs_of(layer)
        if product is not None:
            keys[id(layer)] = weights_key(product[1])
            hook(layer, keys[id(layer)], product[0], False)
            continue
        head = _head_of(layer)
        if head is not None and (tied_heads or not layer.tie_weights):
            hook(layer, weights_key(head), 1, True)
    try:
        for ids in sequences:
            run(ids)
    finally:
        for layer, saved in reversed(hooked):
            restore_method(layer, "call", saved)
    _add_fused(rows, keys, fused)
    return Calibration({key: _joined(by_layer) for key, by_layer in rows.items()})


def _add_fused(rows, keys, fused):
    """Each fused product's key in `rows`, with the rows its first layer
    read (`keys`: each hooked layer's own key, by id)."""
    for key, layer in fused:
        read = rows.get(keys.get(id(layer)), {}).get(id(layer))
        if read is not None:
            rows.setdefault(key, {})[id(layer)] = read


def _joined(by_layer):
    """One product's rows; where layers of equal weights share it (the
    file stores them once, rounded once), each layer's rows scaled to the
    same mean square, so that the rounding serves each in proportion to its
    own output, not to the larger inputs'."""
    parts = [np.concatenate(x) for x in by_layer.values()]
    if len(parts) > 1:
        parts = [x / np.sqrt(max(float(np.mean(x * x)), 1e-30)) for x in parts]
    return np.concatenate(parts)
