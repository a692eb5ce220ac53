"""Replacing a `WeightNorm` wrapper by the plain layer it computes.

At inference the reparameterization `g * v / ||v||` is a constant: computing
it once (docs/design.md §6) leaves the exported graph with the wrapped layer's
own ops and nothing else.
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm.norms import weight_norm
from kerasnorm.norms.weight_norm import WeightNorm
from kerasnorm.norms.weight_norm import kernel_norm_axes
from kerasnorm.norms.weight_norm import output_channel_axes


def effective_kernel(wrapper: WeightNorm) -> np.ndarray:
    """`g * v / ||v||` of a built wrapper, computed in float64."""
    v = np.asarray(wrapper.layer.kernel.numpy(), dtype="float64")
    g = np.asarray(wrapper.g.numpy(), dtype="float64")
    kept = output_channel_axes(v.ndim, wrapper.layer)
    g_shape = [v.shape[a] if a in kept else 1 for a in range(v.ndim)]
    # The layer's own formula (its norm floor included), run in float64.
    kernel = weight_norm.effective_kernel(
        v, g.reshape(g_shape), kernel_norm_axes(v.ndim, wrapper.layer)
    )
    return np.asarray(keras.ops.convert_to_numpy(kernel), dtype="float64")


def unwrap_weight_norm(wrapper: WeightNorm) -> keras.layers.Layer:
    """The plain layer a built `WeightNorm` computes at inference.

    A fresh layer of the wrapped layer's class and config, named after the
    wrapper (so output names in exported signatures do not change), built as
    the wrapped layer was, with `kernel = g * v / ||v||` computed once in
    float64 and stored in the layer's variable dtype, and the wrapped layer's
    bias. The wrapper itself is left untouched.
    """
    if not isinstance(wrapper, WeightNorm):
        raise ValueError(
            "`unwrap_weight_norm` expects a `kerasnorm.WeightNorm`. "
            f"Received: wrapper={wrapper!r} (class {type(wrapper).__name__})"
        )
    if not wrapper.built:
        raise ValueError(
            "`unwrap_weight_norm` needs a built `WeightNorm` (call it or build "
            f"it first). Received: wrapper={wrapper.name!r}, built=False"
        )
    inner = wrapper.layer
    plain = type(inner).from_config({**inner.get_config(), "name": wrapper.name})
    plain.build_from_config(inner.get_build_config())
    plain.kernel.assign(effective_kernel(wrapper).astype(plain.kernel.dtype))
    if inner.bias is not None:
        plain.bias.assign(inner.bias.numpy())
    return plain
