"""One cached step for every keras-hub `CausalLM`: the model's own
`call_with_cache`, with the file's per-layer caches in place of its own.

keras-hub's `generate()` runs `call_with_cache(token_ids, cache,
cache_update_index)`: the embedding, every decoder layer with its slice of
`cache` and the head, each family's own math (rotary scaling, ALiBi, sliding
windows, soft caps, query/key norms, mixtures of experts). The step calls
exactly that, so a family keras-hub adds later needs no code here.

The cache is `[B, layers, 2, L, kv_heads, head_dim]` in most families, one
`(key, value)` pair of `[B, L, kv_heads, head_dim]` per layer in Gemma3; the
file holds `kv_cache_k_<i>` / `kv_cache_v_<i>` `(1, g, L, d)` per layer
(heads first, the layout LiteRT-LM's engine reads). Each layer's key and
value reach the model as a `hub_views.HeadsFirst` view of the file's tensor, which
the write, the repeat of grouped keys and the attention's einsums read in
place: no cache is transposed or repeated. `cached_hub_model` finds
which by building the family's empty cache at two lengths
(`_compat.hub_cache.empty_cache`): the axis that grows is the context. A
cache of any other structure (a recurrent state, a convolution window) is
refused, naming what the cached call keeps.

A stacked cache padded to the largest head size, with layers that write
none (Gemma 4), becomes one cache per writing layer at its own size
(`_written`; docs/design.md §12, "Each layer's own cache").

While the step is traced (`_compat.hub_cache.cache_ops_replaced`):

- no stacked tensor of all layers is built: the model receives a view whose
  `cache[:, i, ...]` is layer `i`'s pair, the attention's
  `ops.stack((key, value), axis=1)` of the rows it wrote is kept as that
  pair, and the CausalLM's stack of the layers' pairs as the list of
  pairs. Each layer reads and writes its own pair, as in the file;
- a write of one row (`ops.slice_update` with one position, the decode
  step) is arithmetic, `cache * (1 - m) + row * m` with `m` one at that row:
  XNNPACK has no dynamic-update-slice, which would split the decode step's
  partition at every layer. Equal to the update to the bit for finite
  values. A prefill's write of `T` rows stays an update.

- keras-hub's causal mask is compared in integers (`causal_mask`): its
  own float sum of the index and an `arange` is an op XNNPACK takes ahead
  of a comparison it does not, which split the decode step in two
  partitions.

The prefill's tokens sit at consecutive positions from `input_pos[0]`
(padded at the end), so `cache_update_index = input_pos[0]`; every family's
cached call takes its rotary or learned positions and its causal mask from
that index.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from kerasnorm._compat.hub_cache import cache_ops_replaced
from kerasnorm._compat.hub_cache import call_replaced
from kerasnorm._compat.hub_cache import causal_mask_replaced
from kerasnorm._compat.hub_cache import empty_cache
from kerasnorm._compat.hub_cache import qwen_window_replaced
from kerasnorm._compat.keras_hub_private import gpt_neox_rotary_layers
from kerasnorm.export.litert_lm.cached import CachedModel
from kerasnorm.export.litert_lm.cached import CachePathError
from kerasnorm.export.litert_lm.families import QUERY_ROTATION_FROM_START
from kerasnorm.export.litert_lm.families import WINDOW_FROM_POSITIONS
from kerasnorm.export.litert_lm.families import family_of
from kerasnorm.export.litert_lm.fused_products import fused_calls
from kerasnorm.export.litert_lm.fused_products import fused_products
from kerasnorm.export.litert_lm.hub_views import Layers
from kerasnorm.export.litert_lm.hub_views import Pair
from kerasnorm.export.litert_lm.hub_views import cache_write
from kerasnorm.export.litert_lm.hub_views import causal_mask
from kerasnorm.export.litert_lm.hub_views import einsum
from kerasnorm.export.litert_lm.hub_views import repeat
from kerasnorm.export.litert_lm.hub_views import to_file
from kerasnorm.export.litert_lm.hub_views import to_hub
from kerasnorm.export.litert_lm.hub_views import window_band


def refusal(model, row):
    """Why `model` (a keras-hub CausalLM) is refused, or None: its family's
    `row` (`families`), or an image or audio encoder built in."""
    name = type(model).__name__
    reason = row.refused
    if reason is not None:
        return (
            f"to_litert_lm: {name} {model.name!r} {reason}; text "
            "CausalLMs with one key/value cache per layer generate (see "
            "the generation guide's family table)."
        )
    for kind in ("vision", "audio"):
        if getattr(model.backbone, f"{kind}_encoder", None) is not None:
            return (
                f"to_litert_lm: {name} {model.name!r} has a {kind} encoder; "
                "the file takes token ids alone. Build the backbone without "
                f"one (e.g. image_size=None / {kind}_encoder=None) for text."
            )
    return None


def _structure(model):
    """`("stacked", [(g, d)] * n)` or `("pairs", [(g, d), ...])`, from the
    family's empty cache at two lengths; `CachePathError` otherwise."""
    name = f"{type(model).__name__} {model.name!r}"
    try:
        short, long = empty_cache(model, 3), empty_cache(model, 4)
    except Exception as error:
        raise CachePathError(
            f"to_litert_lm: {name}'s cached call (call_with_cache, seeded by "
            f"its _build_cache on a 3-token prompt) failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    if _is_tensor(short) and len(short.shape) == 6:
        grows = [a for a in range(6) if short.shape[a] != long.shape[a]]
        if grows == [3] and short.shape[2] == 2:
            _, n, _, _, g, d = short.shape
            return "stacked", [(int(g), int(d))] * int(n)
    pairs = short if isinstance(short, tuple | list) else None
    if pairs and all(
        isinstance(p, tuple | list)
        and len(p) == 2
        and all(_is_tensor(t) and len(t.shape) == 4 for t in p)
        for p in pairs
    ):
        shapes = []
        for p, q in zip(pairs, long, strict=True):
            grows = [a for a in range(4) if p[0].shape[a] != q[0].shape[a]]
            if grows != [1] or p[0].shape != p[1].shape:
                break
            shapes.append((int(p[0].shape[2]), int(p[0].shape[3])))
        else:
            return "pairs", shapes
    raise CachePathError(
        f"to_litert_lm: {name}'s cached call keeps "
        f"{_describe(short)}, not a key/value cache of shape [batch, layers, "
        "2, length, kv_heads, head_dim] or one (key, value) pair of [batch, "
        "length, kv_heads, head_dim] per layer: the file holds one key and "
        "one value cache per layer, so it cannot carry this state."
    )


def _written(model, shapes):
    """Each layer's own cache `(g, d)` (None: it writes none), from what
    its attention writes into its slice in one eager cached call; None
    where the call does not show it plainly (every layer then keeps its
    slice of the stacked cache)."""
    import tensorflow as tf

    zeros = [tf.zeros((1, 4, g, d), model.compute_dtype) for g, d in shapes]
    pairs = [Pair(z, tf.identity(z)) for z in zeros]
    owner = {id(t): (i, j) for i, p in enumerate(pairs) for j, t in enumerate(p.pair)}
    wrote = {}

    def slice_update(original, inputs, start_indices, updates):
        where = owner.get(id(inputs))
        out = original(inputs, start_indices, updates)
        if where is not None:
            wrote.setdefault(where[0], {})[where[1]] = tuple(updates.shape)
        _CACHES[id(out)] = out
        return out

    _CACHES.clear()
    try:
        with cache_ops_replaced(slice_update=slice_update, stack=_stack):
            _, _, cache = model.call_with_cache(
                tf.ones((1, 3), "int32"), Layers(pairs), 0
            )
    except Exception:  # the traced step reports its own error
        return None
    finally:
        _CACHES.clear()
    if not isinstance(cache, Layers) or len(cache.pairs) != len(pairs):
        return None
    own = []
    for i in range(len(shapes)):
        key, value = wrote.get(i, {}).get(0), wrote.get(i, {}).get(1)
        if key is None and value is None:
            returned = cache.pairs[i].pair
            if any(a is not b for a, b in zip(returned, pairs[i].pair, strict=True)):
                return None
            own.append(None)
            continue
        if key is None or value is None or key[2:] != value[2:]:
            return None
        own.append((int(key[2]), int(key[3])))
    return own


def _is_tensor(x):
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _describe(cache):
    return str(
        keras.tree.map_structure(
            lambda t: tuple(t.shape) if _is_tensor(t) else type(t).__name__,
            cache,
        )
    )


def _stack(original, x, axis=0):
    """The attention's `stack((key, value), axis=1)` as a `Pair`, the
    CausalLM's `stack(pairs, axis=1)` as `Layers`; any other as it is."""
    items = list(x) if isinstance(x, tuple | list) else None
    if items and axis == 1 and all(isinstance(i, Pair) for i in items):
        return Layers(items)
    if items and any(isinstance(i, Pair) for i in items):
        raise TypeError(
            "to_litert_lm: the cached call stacked its layers' caches "
            f"along axis {axis}, not 1 as keras-hub's CausalLMs do"
        )
    if items and axis == 1 and len(items) == 2 and all(id(t) in _CACHES for t in items):
        return Pair(*items)
    return original(x, axis=axis)


# The tensors a traced step handed to (or got back from) a layer's cache
# write, by id: the pair `ops.stack((key, value), axis=1)` keeps as a pair.
_CACHES = {}


def _corrected(model, corrections, start, length):
    """Where keras-hub's cached call differs from its own full pass, the
    step follows the full pass: the `corrections` `model`'s family row
    names (`families`), each applied here."""
    stack = contextlib.ExitStack()
    for name in corrections:
        _CORRECTIONS[name](stack, model, start, length)
    return stack


def _query_rotation_from_start(stack, model, start, length):
    """GPT-NeoX's attention rotates the query at positions from 0 whatever
    `cache_update_index` is (the keys, the whole cache, at theirs): the
    query, the call whose length is not the cache's, is rotated from
    `start`."""

    def rotate(original, inputs, start_index=0, positions=None):
        if inputs.shape[1] != length and positions is None:
            start_index = start
        return original(inputs, start_index=start_index, positions=positions)

    for layer in gpt_neox_rotary_layers(model.backbone):
        stack.enter_context(call_replaced(layer, rotate))


def _window_from_positions(stack, model, start, length):
    """Qwen's (and Qwen2's) sliding window in the cached call: its
    attention asks `if cache_update_index` of the index, a tensor while
    traced (keras-hub 0.32: `generate()` fails on it too), then slices the
    rows from there of a square band of ones. The full pass's window is
    that band, `|i - j| < sliding_window_size`, with the rows at their
    positions: each Qwen attention with the window gets the band computed
    from the integer positions `start + t` (`window_band`) in place of
    the slice, the condition skipped (`_compat.hub_cache.qwen_window_replaced`)."""
    stack.enter_context(
        qwen_window_replaced(
            model.backbone,
            lambda mask, window: window_band(mask, start, window),
        )
    )


_CORRECTIONS = {
    QUERY_ROTATION_FROM_START: _query_rotation_from_start,
    WINDOW_FROM_POSITIONS: _window_from_positions,
}


@contextlib.contextmanager
def _last_row(model, active):
    """Where `active`, the last decoder layer (`backbone.transformer_layers`,
    which every family's cached call runs in order) hands on its last row
    alone: the final norm and the head act on each position, so a
    prefill's head costs one row (`CachedModel`'s `last`)."""
    layers = getattr(model.backbone, "transformer_layers", None)
    if not active or not layers:
        yield
        return

    def call(original, *args, **kwargs):
        out = original(*args, **kwargs)
        if isinstance(out, tuple) and out and len(out[0].shape) == 3:
            return (out[0][:, -1:], *out[1:])
        return out

    with call_replaced(layers[-1], call):
        yield


def cached_hub_model(model, row=None, fuse=True):
    """The `CachedModel` of a keras-hub CausalLM through its own
    `call_with_cache`; `row` its family's (`families`), looked up where
    None; with `fuse`, the products that read one input as one
    (`fused_products`)."""
    if row is None:
        row = family_of(model)
    message = refusal(model, row)
    if message is not None:
        raise CachePathError(message)
    layout, shapes = _structure(model)
    # Each layer's own cache (None: it writes none), in the stacked layout.
    own = (_written(model, shapes) if layout == "stacked" else None) or list(shapes)
    written = [i for i, s in enumerate(own) if s is not None]
    dtype = model.compute_dtype
    fused = fused_products(model) if fuse else ()

    def slice_update(original, inputs, start_indices, updates):
        out = cache_write(original, inputs, start_indices, updates)
        _CACHES[id(out)] = out
        return out

    def step(tokens, positions, caches, last=False):
        length = caches[0].shape[2]
        pairs = {
            i: (to_hub(caches[2 * j], dtype), to_hub(caches[2 * j + 1], dtype))
            for j, i in enumerate(written)
        }
        if layout == "stacked":
            # A layer that writes no cache gets an unused slice of the
            # context's length (its mask reads the length from it).
            empty = {
                i: (ops.zeros((1, length, 1, 1), dtype),) * 2
                for i in range(len(own))
                if i not in pairs
            }
            cache = Layers([Pair(*pairs.get(i, empty.get(i))) for i in range(len(own))])
        else:
            cache = tuple(pairs[i] for i in range(len(own)))
        start = ops.cast(positions[0], "int32")
        _CACHES.clear()
        try:
            with (
                cache_ops_replaced(
                    slice_update=slice_update,
                    stack=_stack,
                    repeat=repeat,
                    einsum=einsum,
                ),
                causal_mask_replaced(causal_mask),
                _corrected(model, row.corrections, start, length),
                _last_row(model, last and tokens.shape[1] != 1),
                fused_calls(fused),
            ):
                logits, _, cache = model.call_with_cache(tokens, cache, start)
        finally:
            _CACHES.clear()
        if layout == "stacked":
            if not isinstance(cache, Layers):
                raise CachePathError(
                    f"to_litert_lm: {type(model).__name__}'s cached call "
                    "returned its cache as "
                    f"{type(cache).__name__}, not its layers' pairs stacked "
                    "as keras-hub's CausalLMs stack them"
                )
            cache = [p.pair for p in cache.pairs]
        out = []
        for i in written:
            key, value = cache[i]
            out += [to_file(key), to_file(value)]
        return logits, out

    return CachedModel(
        type(model).__name__,
        [own[i] for i in written],
        step,
        int(model.backbone.vocabulary_size),
        fused=fused,
    )
