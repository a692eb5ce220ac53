"""What to say when a quantized file of a model with a norm over a single
value fails its parity check.

A norm whose statistics are taken over one value per sample (a LayerNorm
or RMSNorm over a last axis of size 1, an InstanceNorm over a length-1
axis) computes no normalization: a mean-subtracting norm outputs its
offset whatever the input, an RMS norm `x / sqrt(x^2 + eps)` times its
gain, the sign of `x` away from 0. Float files reproduce that; a quantized
file rounds `x` near 0 and flips the sign, or adds rounding to an output
that barely varies, and fails its check for a reason no tolerance should
hide. `single_value_norms` names such layers, so that the failure names
the user's layer and what to do.
"""

from __future__ import annotations

import math

import keras

from kerasnorm.export.numerics.errors import with_sentence
from kerasnorm.norms.group_norm import GroupNorm
from kerasnorm.norms.instance_norm import InstanceNorm
from kerasnorm.norms.layer_norm import LayerNorm
from kerasnorm.norms.rms_norm import RMSNorm


def with_single_value_hint(err, prepared):
    """`err` (a failed check of a quantized file) with a sentence naming
    the model's norms over a single value, after its first sentence;
    `err` itself for a float32 or float16 file, or when there is none."""
    if prepared.options.mode.weights != "int8":
        return err
    names = single_value_norms(prepared.facts.layers)
    if not names:
        return err
    hint = (
        f"Layer(s) {', '.join(map(repr, names))} normalize over a single "
        "value per sample: a mean-subtracting norm then outputs its offset "
        "whatever the input, an RMS norm the sign of its input times its "
        "gain, and quantized rounding near 0 flips that sign or shows as "
        "error on an output that barely varies. Normalize over more than "
        "one value (another axis), remove the norm, or export with "
        "quantize=None."
    )
    return with_sentence(err, hint)


def single_value_norms(layers) -> list[str]:
    """The names of the norms among `layers` whose statistics are taken
    over one value per sample, in the order given."""
    return [layer.name for layer in layers if _statistics_size(layer) == 1]


def _statistics_size(layer):
    """How many values one of `layer`'s statistics is taken over, per
    sample; None for a layer that is no norm or whose input shape is not
    known."""
    if not isinstance(
        layer,
        (LayerNorm, RMSNorm, GroupNorm, InstanceNorm, keras.layers.LayerNormalization),
    ):
        return None
    try:
        shape = tuple(layer.input.shape)
    except (AttributeError, ValueError):
        return None
    if isinstance(layer, (GroupNorm, InstanceNorm)):
        # Every axis but the batch's and the channels', and for GroupNorm
        # the channels of one group.
        (channel,) = layer._param_axes(shape)
        channel %= len(shape)
        sizes = [shape[a] for a in range(1, len(shape)) if a != channel]
        if isinstance(layer, GroupNorm):
            channels = shape[channel]
            sizes.append(
                None if channels is None else channels // layer._num_groups(channels)
            )
        return _product(sizes)
    axis = layer.axis
    axes = [axis] if isinstance(axis, int) else list(axis)
    return _product([shape[a] for a in axes])


def _product(sizes):
    """The product of `sizes`, None if one is not known."""
    if any(size is None for size in sizes):
        return None
    return math.prod(sizes)
