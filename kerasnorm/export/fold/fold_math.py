"""The math of folding (docs/design.md §4): BN's inference affine map
x * s + t, and how it merges into a linear layer's weights after or before it.

- BN after a linear layer: scale the kernel along its output-channel axis by s,
  b' = b * s + t.
- BN before a linear layer: scale the kernel along its input-channel axis by s,
  b' = b + sum over input channels and kernel positions of W * t. Exact for
  Dense and "valid" convolutions; with any other padding (and for transposed
  convolutions, whose border outputs get fewer taps) only when t == 0
  (`_fold_plan` refuses the rest).

Weights are float64 numpy arrays by role (`ROLES`), written back by
`_fold_rewrite`.
"""

from __future__ import annotations

import keras
import numpy as np

L = keras.layers

# Exact types, not isinstance: a subclass may change `call`, and rewriting the
# kernel of a layer whose computation is unknown is not a fold.
AFTER_OUTPUT_LAST = (L.Dense, L.Conv1D, L.Conv2D, L.Conv3D)
TRANSPOSED = (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose)
DEPTHWISE = (L.DepthwiseConv1D, L.DepthwiseConv2D)
SEPARABLE = (L.SeparableConv1D, L.SeparableConv2D)
LINEAR = (*AFTER_OUTPUT_LAST, *TRANSPOSED, *DEPTHWISE, *SEPARABLE)
# The weights a folded layer rewrites, by attribute: every weight these
# classes have once LoRA and quantization are ruled out.
ROLES = ("kernel", "depthwise_kernel", "pointwise_kernel", "bias")
ACTIVATIONS = (L.Activation, L.ReLU, L.LeakyReLU, L.PReLU, L.ELU, L.Softmax)


def is_wrapped(layer):
    return type(layer) is L.TimeDistributed


def core_layer(layer):
    """The linear layer that holds the weights, or None if there is none.

    `TimeDistributed` applies its inner layer to every step of axis 1: a BN
    after or before it folds into that inner layer like into the bare layer.
    """
    inner = layer.layer if is_wrapped(layer) else layer
    return inner if type(inner) in LINEAR else None


def activation_name(layer):
    """The name Keras serializes `layer.activation` by ("linear" without
    one); for a callable it has no name for (a lambda, whose serialization
    raises; an unregistered function), its repr: no known activation."""
    activation = getattr(layer, "activation", None)
    if activation is None:
        return "linear"
    try:
        name = keras.activations.serialize(activation)
    except Exception:  # a lambda: Keras reads its source, which may not exist
        return repr(activation)
    return name if isinstance(name, str) else repr(activation)


def scale_shift(bn):
    """s and t of BN's inference affine map, in float64."""
    mean = np.asarray(bn.moving_mean.numpy(), "float64")
    var = np.asarray(bn.moving_variance.numpy(), "float64")
    gamma = np.asarray(bn.gamma.numpy(), "float64") if bn.scale else 1.0
    beta = np.asarray(bn.beta.numpy(), "float64") if bn.center else 0.0
    s = gamma / np.sqrt(var + bn.epsilon) * np.ones_like(mean)
    t = beta - mean * s
    return s, t


def fold_after(layer, values, s, t):
    """y' = y * s + t: scale the output-channel axis, shift the bias."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, SEPARABLE):
        values["pointwise_kernel"] = values["pointwise_kernel"] * s
    elif isinstance(layer, DEPTHWISE):
        kernel = values["kernel"]
        values["kernel"] = kernel * s.reshape(kernel.shape[-2:])
    elif isinstance(layer, TRANSPOSED):
        values["kernel"] = values["kernel"] * s[:, None]
    else:
        values["kernel"] = values["kernel"] * s
    values["bias"] = bias * s + t


def fold_before(layer, values, s, t):
    """y = W(x * s + t) + b: scale the input-channel axis, bias += sum W * t."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, L.Dense):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        values["bias"] = bias + t @ kernel
    elif isinstance(layer, SEPARABLE):
        depthwise = values["depthwise_kernel"]
        pointwise = values["pointwise_kernel"]
        values["depthwise_kernel"] = depthwise * s[:, None]
        spatial = tuple(range(depthwise.ndim - 2))
        shifted = (depthwise * t[:, None]).sum(axis=spatial).reshape(-1)
        values["bias"] = bias + shifted @ pointwise.reshape(-1, pointwise.shape[-1])
    elif isinstance(layer, DEPTHWISE):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[:, None]).sum(axis=spatial).reshape(-1)
    elif isinstance(layer, TRANSPOSED):
        values["kernel"] = values["kernel"] * s  # t == 0 (_fold_plan.border_problem)
        values["bias"] = bias + np.zeros(values["kernel"].shape[-2])
    else:
        kernel = values["kernel"]  # (..., in / groups, out)
        cin_g, cout = kernel.shape[-2:]
        cout_g = cout // layer.groups
        # Input channel of kernel row i for output o: group(o) * cin_g + i.
        index = (np.arange(cout) // cout_g)[None, :] * cin_g + np.arange(cin_g)[:, None]
        values["kernel"] = kernel * s[index]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[index]).sum(axis=(*spatial, -2))
