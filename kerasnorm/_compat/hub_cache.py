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
(Keras 3.10.0 and 3.15.1). Checked on keras-hub 0.32.
"""

from __future__ import annotations

import contextlib
import inspect

import keras

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
def cache_ops_replaced(slice_update=None, stack=None):
    """While active, `keras.ops.slice_update` calls `slice_update(original,
    inputs, start_indices, updates)` and `keras.ops.stack` calls
    `stack(original, x, axis=0)` on the TensorFlow backend; restored on exit
    (also on an error)."""
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
        with backend_numpy_replaced(stack=stack):
            yield
    finally:
        if saved is not None:
            core.slice_update = saved


def as_keras_structure(cls, children, rebuild):
    """Make instances of `cls` a structure of Keras' `tree` (optree's
    `"keras"` namespace, Keras 3.10.0 and 3.15.1): a layer's call argument
    that holds one is then a nested argument of tensors (`children(x)`),
    which Keras accepts where a call takes `**kwargs`, rebuilt with
    `rebuild(children)`. Nothing is done where Keras' tree is not optree."""
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
            lambda x: (children(x), None),
            lambda _, values: rebuild(values),
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
    (an attribute on the instance, which `Layer.__call__` looks up)."""
    original = layer.call

    def replaced(*args, **kwargs):
        return call(original, *args, **kwargs)

    layer.call = replaced
    try:
        yield
    finally:
        del layer.call
