"""`jit_compile="norms"`: XLA for the normalization layers only.

A conv net is the case where whole-step XLA loses on a CPU: XLA:CPU's
convolutions are slower than the oneDNN kernels TensorFlow calls. Its
normalization layers are the opposite case: without XLA, a GroupNorm is a
dozen small TensorFlow ops forward and more backward, each a pass over the
activations; under XLA they fuse into a few kernels. In this mode the step
stays a TensorFlow graph (convolutions and matmuls on TensorFlow's kernels)
and every normalization layer's `call` (kerasnorm's and Keras' own, see
`NORM_LAYERS`) is its own XLA program, forward and backward.

The swap happens only while the training step is traced: the layers' `call`
is replaced by an XLA-compiled `tf.function` of itself for the duration of
the model's training forward pass and put back right after, so `predict`,
`evaluate`, saving and export see the layers as they are.
"""

import contextlib
import functools
import weakref

import keras
import tensorflow as tf

from kerasnorm import _compat
from kerasnorm.norms import GroupNorm
from kerasnorm.norms import InstanceNorm
from kerasnorm.norms import LayerNorm
from kerasnorm.norms import RMSNorm

# The layers that get their own XLA program: kerasnorm's normalization
# layers and Keras' own. Each computes its statistics on the replica's
# batch, so its XLA program needs no communication; a synchronized
# BatchNormalization all-reduces inside `call` and is left out.
NORM_LAYERS = (
    LayerNorm,
    RMSNorm,
    GroupNorm,
    InstanceNorm,
    keras.layers.LayerNormalization,
    keras.layers.RMSNormalization,
    keras.layers.GroupNormalization,
    keras.layers.BatchNormalization,
)

# model -> [(layer, XLA-compiled call)] for the models in "norms" mode.
_COMPILED = weakref.WeakKeyDictionary()


def norm_layers(model) -> list:
    """The normalization layers of `model` (`NORM_LAYERS`), nested ones
    included."""
    return [
        layer
        for layer in _compat.sublayers(model, recursive=True)
        if isinstance(layer, NORM_LAYERS)
        and getattr(layer, "synchronized", False) is not True
    ]


def require_norm_layers(model, alternatives: str) -> None:
    """Refuse "norms" mode for a model without a normalization layer."""
    if not norm_layers(model):
        raise ValueError(
            "jit_compile='norms' XLA-compiles the normalization layers "
            f"({', '.join(c.__name__ for c in NORM_LAYERS)}; not a "
            f"synchronized BatchNormalization), and model '{model.name}' has "
            f"none. Pass {alternatives}."
        )


def compiled_norm_calls(model) -> list:
    """[(layer, its `call` as an XLA-compiled `tf.function`)] for each norm
    layer of `model`."""
    return [
        (layer, tf.function(layer.call, jit_compile=True, reduce_retracing=True))
        for layer in norm_layers(model)
    ]


def enable(model) -> None:
    """Put `model` in "norms" mode; takes effect at the next trace."""
    if model in _COMPILED:
        return
    _COMPILED[model] = compiled_norm_calls(model)
    _wrap_train_step(model)


def disable(model) -> None:
    """Take `model` out of "norms" mode; takes effect at the next trace."""
    _COMPILED.pop(model, None)


def is_enabled(model) -> bool:
    return model in _COMPILED


def compiled_calls(model):
    """While tracing: `model`'s norm layers call their XLA-compiled `call`.

    A no-op for a model not in "norms" mode.
    """
    return swapped_calls(_COMPILED.get(model, ()))


@contextlib.contextmanager
def swapped_calls(pairs):
    """Within the block, each `layer` of `pairs` calls the function paired
    with it instead of its own `call`."""
    saved = [layer.__dict__.get("call") for layer, _ in pairs]
    for layer, compiled in pairs:
        _compat.replace_method(layer, "call", compiled)
    try:
        yield
    finally:
        for (layer, _), own in zip(pairs, saved, strict=True):
            _compat.restore_method(layer, "call", own)


def _wrap_train_step(model):
    """Run the model's `train_step` (what Keras' `fit` traces on one device)
    inside `compiled_calls`. Under a strategy, kerasnorm's own replica step
    enters `compiled_calls` itself."""
    step = model.train_step
    if getattr(step, "_kerasnorm_norms", False):
        return

    @functools.wraps(step)
    def train_step(data):
        with compiled_calls(model):
            return step(data)

    train_step._kerasnorm_norms = True
    _compat.replace_method(model, "train_step", train_step)
