"""Which layers a streaming step can run one time step at a time, and why
the others cannot: each `*_problem` function returns the sentence the
step plan's refusal quotes (None when the layer can stream)."""

from __future__ import annotations

import keras

from kerasnorm._compat import keras_layers
from kerasnorm.norms._base import AxesNormBase
from kerasnorm.norms._base import ChannelNormBase
from kerasnorm.norms.weight_norm import WeightNorm

TIME_AXIS = 1

_ELEMENTWISE = (
    keras.layers.Activation,
    keras.layers.ReLU,
    keras.layers.LeakyReLU,
    keras.layers.ELU,
    keras.layers.Dropout,
    keras.layers.SpatialDropout1D,
    keras.layers.GaussianNoise,
    keras.layers.GaussianDropout,
    keras.layers.AlphaDropout,
    keras.layers.Identity,
    keras.layers.Add,
    keras.layers.Subtract,
    keras.layers.Multiply,
    keras.layers.Average,
    keras.layers.Maximum,
    keras.layers.Minimum,
)
_CONVOLUTIONS = (
    keras.layers.Conv1D,
    keras.layers.Conv1DTranspose,
    keras.layers.SeparableConv1D,
    keras.layers.DepthwiseConv1D,
)
_ATTENTION = (
    keras.layers.MultiHeadAttention,
    keras.layers.GroupQueryAttention,
    keras.layers.Attention,
    keras.layers.AdditiveAttention,
)
_POOLING = (
    keras.layers.GlobalAveragePooling1D,
    keras.layers.GlobalMaxPooling1D,
    keras.layers.AveragePooling1D,
    keras.layers.MaxPooling1D,
    # Keras 3.15's, not in Keras 3.10.
    *keras_layers("AdaptiveAveragePooling1D", "AdaptiveMaxPooling1D"),
)


def recurrent_problem(layer):
    """Why recurrent `layer` cannot run one step per call, or None."""
    if layer.go_backwards:
        return (
            "runs with go_backwards=True, from the last time step to the "
            "first: its first output needs the whole sequence"
        )
    if layer.return_state:
        return (
            "returns its states (return_state=True); the streaming step "
            "returns every state as a signature output already"
        )
    if layer.stateful:
        return (
            "is stateful: its state carries across calls inside the model; "
            "export a stateless copy (same weights) and let the app carry the "
            "step's state outputs"
        )
    return None


def mixing_problem(layer):
    """Why a non-recurrent `layer` on a time step mixes time steps, or None."""
    for classes, rule in _RULES:
        if isinstance(layer, classes):
            return rule(layer)
    return (
        "is not a layer known to act on each time step on its own (known: "
        "Dense, activations, Dropout, merges, feature-axis norms, "
        "TimeDistributed, recurrent layers)"
    )


def token_problem(layer):
    """Why `layer`, on a time step of a `(batch, time)` token input (before
    its embedding), would mix time steps, or None: only an `Embedding` and
    elementwise layers act on each token on its own there; a `Dense`, say,
    acts on the last axis, which is time."""
    if isinstance(layer, (keras.layers.Embedding, *_ELEMENTWISE)):
        return None
    return (
        "acts on a (batch, time) token input before its Embedding, where the "
        "last axis is time; only an Embedding and elementwise layers act on "
        "each token on its own"
    )


# `keras.ops` calls a Functional graph records for a mask: elementwise
# comparisons (`Embedding.compute_mask`'s `not_equal(ids, 0)`) and the
# reduction over the features of `Masking.compute_mask`.
_ELEMENTWISE_OPERATIONS = ("NotEqual", "Equal", "LogicalAnd", "LogicalOr", "Cast")
_FEATURE_REDUCTIONS = ("Any", "All")


def mask_operation_problem(operation, kwargs, tokens):
    """Why a `keras.ops` call of the graph mixes time steps, or None."""
    name = type(operation).__name__
    if name in _ELEMENTWISE_OPERATIONS:
        return None
    axis = getattr(operation, "axis", kwargs.get("axis"))
    if name in _FEATURE_REDUCTIONS and not tokens and axis in (-1, 2, (-1,), [-1]):
        return None
    return (
        "is a keras.ops call a streaming step does not know to act on each "
        "time step on its own (known: the masks of Embedding(mask_zero=True) "
        "and Masking); wrap it in a layer a step accepts, or export without "
        "streaming=True"
    )


def _no_problem(layer):
    return None


def _convolution_problem(layer):
    if tuple(layer.kernel_size) == (1,) and tuple(layer.strides) == (1,):
        return None
    return (
        f"convolves over time (kernel_size={tuple(layer.kernel_size)}, "
        f"strides={tuple(layer.strides)}): each output needs neighbouring "
        "time steps"
    )


def _axes_problem(axis, verb):
    axes = [axis] if isinstance(axis, int) else list(axis)
    if any(a % 3 == TIME_AXIS for a in axes):
        return f"{verb} over the time axis (axis={axis})"
    return None


# The first rule whose classes match decides; a layer no rule matches is
# refused (a layer kerasnorm does not know may look at any time step).
_RULES = (
    (
        keras.layers.Bidirectional,
        lambda layer: (
            "is bidirectional: its backward half starts from the last time "
            "step, so every output needs the whole sequence"
        ),
    ),
    # Dense acts on the last axis; TimeDistributed's layer sees one step.
    # An embedding looks up each token on its own.
    (
        (
            *_ELEMENTWISE,
            keras.layers.Dense,
            keras.layers.TimeDistributed,
            keras.layers.Embedding,
            keras.layers.Masking,
        ),
        _no_problem,
    ),
    (WeightNorm, lambda layer: mixing_problem(layer.layer)),
    (_CONVOLUTIONS, _convolution_problem),
    (_ATTENTION, lambda layer: "attends over the time steps of the sequence"),
    (_POOLING, lambda layer: "pools over the time axis"),
    (
        ChannelNormBase,
        lambda layer: (
            "computes its statistics over the time axis (the spatial axes of "
            "a (batch, time, channels) input)"
        ),
    ),
    (
        (AxesNormBase, keras.layers.LayerNormalization, keras.layers.UnitNormalization),
        lambda layer: _axes_problem(layer.axis, "normalizes"),
    ),
    (keras.layers.Softmax, lambda layer: _axes_problem(layer.axis, "takes a softmax")),
    # At inference a per-feature affine map, unless its feature axis is time.
    (
        keras.layers.BatchNormalization,
        lambda layer: _axes_problem(layer.axis, "has its statistics per position"),
    ),
    (keras.layers.Concatenate, lambda layer: _axes_problem(layer.axis, "concatenates")),
)
