"""keras-hub's cached call, reached where it has no public handle.

A keras-hub `CausalLM` generates through `call_with_cache(token_ids, cache,
cache_update_index)` (public); the shape of the cache it takes is known only
to the family's `_build_cache(token_ids, ...)` (private, the same in every
family since keras-hub 0.8; Gemma3's takes its vision inputs too, None for
text). Inside the call, every family's attention reads its layer's pair as
`cache[:, 0, ...]` / `cache[:, 1, ...]`, writes the new rows with
`keras.ops.slice_update` and returns `keras.ops.stack((key, value), axis=1)`;
the CausalLM stacks the layers' pairs again (`ops.stack(caches, axis=1)`).
`cache_ops_replaced` hooks those two `keras.ops` functions while a step is
traced, as `keras_tracing.backend_numpy_replaced` hooks the numpy ones:
`keras.ops.slice_update` looks `backend.core.slice_update` up at each call
(Keras 3.10.0 and 3.15.1); `ops.repeat` and `ops.einsum` are hooked the
same way, so that the attention reads the file's cache layout.
`causal_mask_replaced` swaps the causal-mask function every family's
decoder imports by name, and `qwen_window_replaced` Qwen's private window
methods. Checked on keras-hub 0.32.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import keras

from kerasnorm._compat.keras_private import replace_method
from kerasnorm._compat.keras_private import restore_method
from kerasnorm._compat.keras_tracing import backend_numpy_replaced

try:  # Keras' backend module, whose attributes keras.ops looks up per call.
    from keras.src import backend as _keras_backend
except ImportError:  # pragma: no cover - Keras without keras.src
    _keras_backend = None


def empty_cache(model, length):
    """The cache `model` (a keras-hub CausalLM) generates `length` tokens
    with, seeded by its own cached call on `length` ones: what
    `model._build_cache` returns (its second output)."""
    build = model._build_cache
    extra = [
        name
        for name, p in inspect.signature(build).parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][1:]
    tokens = keras.ops.ones((1, length), "int32")
    return build(tokens, **dict.fromkeys(extra))[1]


@contextlib.contextmanager
def cache_ops_replaced(slice_update=None, **numpy_functions):
    """While active, `keras.ops.slice_update` calls `slice_update(original,
    inputs, start_indices, updates)` and each `keras.ops.<name>` of
    `numpy_functions` (`stack`, `repeat`, `einsum`) calls
    `function(original, *args, **kwargs)` on the TensorFlow backend;
    restored on exit (also on an error)."""
    core = getattr(_keras_backend, "core", None)
    saved = None
    if (
        slice_update is not None
        and core is not None
        and keras.backend.backend() == "tensorflow"
        and hasattr(core, "slice_update")
    ):
        saved = core.slice_update
        original = saved

        def replaced(inputs, start_indices, updates):
            return slice_update(original, inputs, start_indices, updates)

        core.slice_update = replaced
    try:
        with backend_numpy_replaced(**numpy_functions):
            yield
    finally:
        if saved is not None:
            core.slice_update = saved


def as_keras_structure(cls, children, rebuild, metadata=None):
    """Make instances of `cls` a structure of Keras' `tree` (optree's
    `"keras"` namespace, Keras 3.10.0 and 3.15.1): a layer's call argument
    that holds one is then a nested argument of tensors (`children(x)`),
    which Keras accepts where a call takes `**kwargs`, rebuilt with
    `rebuild(children)` (`rebuild(children, metadata(x))` where `metadata`
    is given). Nothing is done where Keras' tree is not optree."""
    try:
        import optree
        from keras.src.tree import tree_api
    except ImportError:  # pragma: no cover - other trees
        return
    if "optree" not in tree_api.tree_impl.__name__:
        return  # pragma: no cover
    try:
        optree.register_pytree_node(
            cls,
            lambda x: (children(x), None if metadata is None else metadata(x)),
            lambda aux, values: (
                rebuild(values) if metadata is None else rebuild(values, aux)
            ),
            namespace="keras",
        )
    except ValueError:  # registered already
        pass


def sublayers(layer):
    """Every layer inside `layer`, nested ones too (`Layer._flatten_layers`,
    private; Keras 3.10.0 and 3.15.1)."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


@contextlib.contextmanager
def call_replaced(layer, call):
    """While active, `layer`'s call is `call(original, *args, **kwargs)`
    (an attribute on the instance, which `Layer.__call__` looks up); nested,
    each exit puts back the call it replaced."""
    original = layer.call
    had = "call" in vars(layer)

    def replaced(*args, **kwargs):
        return call(original, *args, **kwargs)

    layer.call = replaced
    try:
        yield
    finally:
        if had:
            layer.call = original
        else:
            del layer.call


@contextlib.contextmanager
def causal_mask_replaced(compute):
    """While active, keras-hub's `compute_causal_mask(batch_size,
    input_length, output_length, cache_index)` (its
    `layers.modeling.transformer_layer_utils`, which every family's decoder
    imports by name to build the cached call's mask, keras-hub 0.8 to 0.32)
    is `compute` in every loaded keras-hub module that holds it; restored
    on exit (also on an error). Nothing is replaced where keras-hub has no
    such function."""
    try:
        from keras_hub.src.layers.modeling import transformer_layer_utils
    except ImportError:  # pragma: no cover - keras-hub moved it
        yield False
        return
    original = getattr(transformer_layer_utils, "compute_causal_mask", None)
    holders = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("keras_hub.")
        and module is not None
        and getattr(module, "compute_causal_mask", None) is original
    ]
    if original is None:  # pragma: no cover
        holders = []
    for module in holders:
        module.compute_causal_mask = compute
    try:
        yield bool(holders)
    finally:
        for module in holders:
            module.compute_causal_mask = original


@contextlib.contextmanager
def qwen_window_replaced(backbone, band):
    """While active, each `QwenAttention` of `backbone` with
    `use_sliding_window_attention` (Qwen, Qwen2; keras-hub 0.32) masks its
    scores with `band(attention_mask, sliding_window_size)` in place of its
    private `_mask_sliding_window(attention_mask, cache_update_index)`, and
    its private `_compute_attention` is called with `cache_update_index=None`:
    it asks `if cache_update_index`, which a traced tensor cannot answer.
    Restored on exit (also on an error); nothing where keras-hub has no
    such class."""
    try:
        from keras_hub.src.models.qwen.qwen_attention import QwenAttention
    except ImportError:  # pragma: no cover - keras-hub moved it
        yield
        return
    saved = []
    for layer in sublayers(backbone):
        if not (
            isinstance(layer, QwenAttention) and layer.use_sliding_window_attention
        ):
            continue
        compute, window = layer._compute_attention, layer.sliding_window_size

        def attend(q, k, v, attention_mask=None, cache_update_index=None, _c=compute):
            return _c(q, k, v, attention_mask, cache_update_index=None)

        def mask(attention_mask, cache_update_index=0, _w=window):
            return band(attention_mask, _w)

        names = ("_compute_attention", "_mask_sliding_window")
        saved.append((layer, {n: layer.__dict__.get(n) for n in names}))
        replace_method(layer, "_compute_attention", attend)
        replace_method(layer, "_mask_sliding_window", mask)
    try:
        yield
    finally:
        for layer, methods in saved:
            for name, method in methods.items():
                restore_method(layer, name, method)
