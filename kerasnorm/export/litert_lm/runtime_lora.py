"""Runtime LoRA: a base file that takes LiteRT-LM's adapter inputs, and the
adapter files it is fed.

LiteRT-LM's engine (`Engine(..., lora_rank_config=LoraRankConfig(r))`,
`create_conversation(lora_config=LoraConfig(lora_path=...))`) feeds each
signature input named `lora_atten_{q,k,v,o}_{a,b}_prime_weight_<layer>`
the adapter file's tensor of that name, copied byte for byte after a size
check, and zeros where the adapter has none (`runtime/components/lora.cc`,
`runtime/util/lora_util.cc`). The file decides what the inputs mean; here,
as litert-torch's `apply_lora`, the projection's output gains `x @ A' @ B'`
on the activations (never a weight-sized product).

Keras' LoRA on an `EinsumDense` (keras-hub's `enable_lora` adapts the
attention's query and value) is per head: `lora_kernel_a` is the kernel's
shape with its last axis the rank, `lora_kernel_b` `(rank, head_dim)`
shared by the heads, and the layer adds `alpha / rank * einsum(x, a) @ b`.
The inputs hold exactly those factors, every one with the rank as an axis:

- `A'` `(in * heads, rank)`: `alpha / rank * a`, its rows ordered (input
  channel, head) (`in` the product of the axes the projection contracts;
  one head for the attention's output projection, where `A'` is
  litert-torch's `(in, rank)`);
- `B'` `(rank, out)`: `b` (`out` the projection's last output axis).

In the graph: `x` flattened to `in`, times `A'` read as `(in, heads *
rank)`, split to `(heads, rank)`, times `B'`: the per-head product Keras
computes, in two matmuls on activations. A larger `lora_rank` reserves
rank for adapters of a larger rank (zero-padded; the engine's inputs all
share one rank, 16 or 32 in LiteRT-LM 0.18.1: `ENGINE_RANKS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from kerasnorm._compat.hub_cache import call_replaced
from kerasnorm._compat.keras_lora import lora_layers
from kerasnorm._compat.keras_lora import lora_variables
from kerasnorm._compat.keras_lora import set_lora_enabled
from kerasnorm._compat.keras_private import sublayers
from kerasnorm.export.litert_lm.check import check_generation
from kerasnorm.export.prepare.weights import merged_lora

# keras-hub's attention projections by layer name, to the engine's letter.
PROJECTIONS = {
    "query": "q",
    "key": "k",
    "value": "v",
    "attention_output": "o",
    "output": "o",
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
}
INPUT_NAME = "lora_atten_{projection}_{side}_prime_weight_{layer}"
LORA_MODES = ("merge", "runtime")
# The ranks LiteRT-LM's engine runs an adapter at (0.18.1 refuses others:
# "Currently only support rank 16 and 32, but got rank: 4"); a model's
# smaller rank is zero-padded to the smallest that holds it.
ENGINE_RANKS = (16, 32)


@dataclasses.dataclass(frozen=True)
class Adapted:
    """One adapted projection: decoder layer `index`, `projection` (q, k,
    v, o), the Keras layer, and the sizes of its factors."""

    layer: object
    index: int
    projection: str
    size_in: int  # the product of the contracted axes
    heads: int  # the product of the output axes before the last
    size_out: int  # the last output axis
    rank: int  # the layer's own LoRA rank
    batch_axes: int  # the equation's axes the input and output share

    def names(self):
        return tuple(
            INPUT_NAME.format(projection=self.projection, side=side, layer=self.index)
            for side in ("a", "b")
        )

    def shapes(self, rank):
        return (self.size_in * self.heads, rank), (rank, self.size_out)

    def factors(self, rank):
        """`(A', B')` float32 for `rank` (>= the layer's: zero-padded)."""
        import keras

        _, a, b = lora_variables(self.layer)
        a = np.asarray(keras.ops.convert_to_numpy(a.value), np.float64)
        b = np.asarray(keras.ops.convert_to_numpy(b.value), np.float64)
        alpha = getattr(self.layer, "lora_alpha", None)
        scale = 1.0 if alpha is None else alpha / self.layer.lora_rank
        rows = a
        if getattr(self.layer, "equation", None) is not None:
            # `einsum(x, a)` of the identity over the input: a's rows in
            # the order the graph flattens `x`, each (heads, rank).
            x = np.eye(self.size_in).reshape(
                (1,) * (self.batch_axes - 1) + (self.size_in,) + self._contracted()
            )
            rows = np.einsum(self.layer.equation, x, a)
        rows = rows.reshape(self.size_in, self.heads, self.rank)
        a_prime = np.zeros((self.size_in, self.heads, rank))
        a_prime[..., : self.rank] = scale * rows
        b_prime = np.zeros((rank, self.size_out))
        b_prime[: self.rank] = b
        shape_a, _ = self.shapes(rank)
        return (
            a_prime.reshape(shape_a).astype(np.float32),
            b_prime.astype(np.float32),
        )

    def _contracted(self):
        inputs, kernel, outputs = _specs(self.layer.equation)
        kernel_shape = tuple(lora_variables(self.layer)[0].shape)
        return tuple(
            kernel_shape[kernel.index(c)]
            for c in inputs
            if c in kernel and c not in outputs
        )

    def added(self, x, a_prime, b_prime):
        """`x @ A' @ B'` in the projection's output shape (`x` its input)."""
        from keras import ops

        rank = b_prime.shape[0]
        lead = tuple(x.shape[: self.batch_axes])
        flat = ops.reshape(x, (*lead, self.size_in))
        a = ops.reshape(a_prime, (self.size_in, self.heads * rank))
        low = ops.reshape(ops.matmul(flat, a), (*lead, self.heads, rank))
        return ops.matmul(low, b_prime)


@dataclasses.dataclass(frozen=True)
class RuntimeLora:
    """The model's adapted projections and the file's rank."""

    adapted: tuple
    rank: int

    def input_specs(self):
        import tensorflow as tf

        specs = []
        for item in self.adapted:
            for name, shape in zip(item.names(), item.shapes(self.rank), strict=True):
                specs.append(tf.TensorSpec(shape, tf.float32, name=name))
        return specs

    def input_names(self):
        return [name for item in self.adapted for name in item.names()]

    def tensors(self, rank=None):
        """`{input name: array}`: the model's adapter at `rank` (the
        file's by default)."""
        rank = self.rank if rank is None else rank
        out = {}
        for item in self.adapted:
            for name, value in zip(item.names(), item.factors(rank), strict=True):
                out[name] = value
        return out

    def zeros(self):
        """`{input name: zeros}`: no adapter (the engine's fill)."""
        return {
            name: np.zeros(shape, np.float32)
            for item in self.adapted
            for name, shape in zip(item.names(), item.shapes(self.rank), strict=True)
        }

    @contextlib.contextmanager
    def fed(self, inputs):
        """While active (a step traced), each adapted layer computes its
        base projection (LoRA off) plus `x @ A' @ B'` from `inputs`, the
        traced inputs in `input_specs`' order."""
        pairs = [inputs[2 * k : 2 * k + 2] for k in range(len(self.adapted))]
        with contextlib.ExitStack() as stack:
            for item, (a_prime, b_prime) in zip(self.adapted, pairs, strict=True):
                stack.enter_context(
                    call_replaced(item.layer, _call(item, a_prime, b_prime))
                )
                set_lora_enabled(item.layer, False)
                stack.callback(set_lora_enabled, item.layer, True)
            yield

    @contextlib.contextmanager
    def off(self):
        """While active, the model computes without its adapters (the
        base model the file with zero adapters is checked against)."""
        try:
            for item in self.adapted:
                set_lora_enabled(item.layer, False)
            yield
        finally:
            for item in self.adapted:
                set_lora_enabled(item.layer, True)


def runtime_lora_of(model, generating, options):
    """The export's `RuntimeLora` with `lora="runtime"`, None with
    `"merge"`; refusals that name the option and the way on."""
    if options.lora not in LORA_MODES:
        raise ValueError(
            f"to_litert_lm: `lora` is one of {LORA_MODES}: merge the adapters "
            "into the weights, or write the file with LiteRT-LM's adapter "
            f"inputs. Received: lora={options.lora!r}"
        )
    if options.lora == "merge":
        if options.lora_rank is not None:
            raise ValueError(
                '`lora_rank` is the adapter rank a lora="runtime" file '
                'takes; merged adapters have none. Pass lora="runtime" or no '
                f"lora_rank. Received: lora_rank={options.lora_rank!r}"
            )
        return None
    if generating is not model:
        raise ValueError(
            f'to_litert_lm: lora="runtime" takes a float32 model; {model.name!r} '
            "computes in half precision (its float32 copy carries no adapters). "
            'Build it in float32, or export with lora="merge".'
        )
    if options.smooth not in (None, False):
        raise ValueError(
            "to_litert_lm: smooth rescales the inputs of the attention's "
            "projections, which the adapters fed at run time read as they "
            'are: pass smooth=None with lora="runtime". '
            f"Received: smooth={options.smooth!r}"
        )
    return runtime_lora(model, options.lora_rank)


def checked_with_adapter(model, content, prompts, lora, judged):
    """`(check, base_check)`: the file against `model` (fed the model's
    adapter with `lora`), and with zero adapters against the base model
    (None without `lora`)."""
    if lora is None:
        return check_generation(model, content, prompts, **judged), None
    check = check_generation(model, content, prompts, adapter=lora.tensors(), **judged)
    with lora.off():
        base = check_generation(model, content, prompts, **judged)
    return check, base


def merged_unless_runtime(model, lora):
    """`prepare.weights.merged_lora(model)` without `lora`; with it, the
    adapters kept (the step reads them from the file's inputs). Yields
    the merged layers' names."""
    return merged_lora(model) if lora is None else contextlib.nullcontext(())


def lora_fields(lora, base_check):
    """`GenerativeExport`'s runtime LoRA fields."""
    if lora is None:
        return {}
    names = tuple(lora.input_names())
    return {"adapter_inputs": names, "lora_rank": lora.rank, "base_check": base_check}


def _call(item, a_prime, b_prime):
    from keras import ops

    def call(original, inputs, *args, **kwargs):
        base = original(inputs, *args, **kwargs)
        added = item.added(inputs, a_prime, b_prime)
        return ops.add(base, ops.reshape(ops.cast(added, base.dtype), base.shape))

    return call


def _specs(equation):
    left, outputs = equation.replace(" ", "").split("->")
    inputs, kernel = left.split(",")
    return inputs, kernel, outputs


def runtime_lora(model, lora_rank=None, caller="to_litert_lm"):
    """The `RuntimeLora` of a keras-hub CausalLM with LoRA enabled; a
    `ValueError` naming what the engine cannot take as inputs."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            f"{caller}: {model.name!r} has no LoRA adapters (call "
            "`model.backbone.enable_lora(rank)` and fine-tune it first); "
            'lora="runtime" writes the inputs of adapted attention '
            'projections. Received: lora="runtime"'
        )
    decoders = list(
        getattr(getattr(model, "backbone", None), "transformer_layers", []) or []
    )
    owner = {}
    for index, decoder in enumerate(decoders):
        for layer in sublayers(decoder, recursive=True):
            owner[id(layer)] = index
    adapted, refused = [], []
    for layer in layers:
        projection = PROJECTIONS.get(layer.name)
        shape = _shape(layer) if projection and id(layer) in owner else None
        if shape is None:
            refused.append(f"{layer.name!r} ({type(layer).__name__})")
            continue
        adapted.append(Adapted(layer, owner[id(layer)], projection, *shape))
    if refused:
        raise ValueError(
            f"{caller}: LiteRT-LM's engine takes adapters on the attention's "
            "query, key, value and output projections only "
            f"(lora_atten_{{q,k,v,o}}_{{a,b}}_prime_weight_<layer>); "
            f"{model.name!r} has LoRA on {', '.join(refused)}. Export with "
            'lora="merge" (the default: the adapters merged into the '
            "weights), or enable LoRA on the attention projections only."
        )
    seen = {}
    for item in adapted:
        key = (item.index, item.projection)
        if key in seen:
            raise ValueError(
                f"{caller}: decoder layer {item.index} has two adapted "
                f"{item.projection!r} projections ({seen[key]!r} and "
                f"{item.layer.name!r}); the engine takes one per layer."
            )
        seen[key] = item.layer.name
    rank = _rank(max(item.rank for item in adapted), lora_rank, caller)
    adapted.sort(key=lambda item: (item.index, "qkvo".index(item.projection)))
    return RuntimeLora(tuple(adapted), rank)


def _rank(own, lora_rank, caller):
    """The file's rank: one LiteRT-LM's engine runs (`ENGINE_RANKS`), at
    least the model's."""
    fits = [r for r in ENGINE_RANKS if r >= own]
    if not fits:
        raise ValueError(
            f"{caller}: the model's LoRA rank is {own}; LiteRT-LM's engine "
            f"runs adapters of rank {' or '.join(map(str, ENGINE_RANKS))} only "
            '(0.18.1: "Currently only support rank 16 and 32"). Export with '
            'lora="merge", or fine-tune at a rank of at most 32.'
        )
    if lora_rank is None:
        return fits[0]
    if lora_rank not in fits or isinstance(lora_rank, bool):
        raise ValueError(
            f"{caller}: `lora_rank` is the adapter rank the file takes, one "
            f"LiteRT-LM's engine runs and at least the model's ({own}): "
            f"{' or '.join(map(str, fits))}. Received: lora_rank={lora_rank!r}"
        )
    return lora_rank


def _shape(layer):
    """`(size_in, heads, size_out, rank, batch_axes)` of an `EinsumDense`
    (or `Dense`) whose input ends in the contracted axes and whose output
    is the shared axes, then the kernel's output axes; None otherwise."""
    kernel, _, b = lora_variables(layer)
    equation = getattr(layer, "equation", None)
    if equation is None:  # a Dense: "...i,ij->...j"
        return int(kernel.shape[0]), 1, int(kernel.shape[1]), int(b.shape[0]), 2
    inputs, spec, outputs = _specs(equation)
    contracted = [c for c in inputs if c in spec and c not in outputs]
    shared = [c for c in inputs if c in outputs and c not in spec]
    kept = [c for c in spec if c in outputs]
    if (
        list(inputs) != shared + contracted
        or list(outputs) != shared + kept
        or not kept
        or kept[-1] != spec[-1]
        or any(c not in inputs and c not in outputs for c in spec)
    ):
        return None
    size = dict(zip(spec, kernel.shape, strict=True))
    return (
        math.prod(int(size[c]) for c in contracted),
        math.prod(int(size[c]) for c in kept[:-1]),
        int(size[kept[-1]]),
        int(b.shape[0]),
        len(shared),
    )
