"""Keras' LoRA state on `Dense` / `EinsumDense`, read and switched for
export (see `kerasnorm._compat`).

`layer.enable_lora(rank)` (Keras 3, keras-hub's `backbone.enable_lora`)
freezes the kernel and adds `lora_kernel_a`, `lora_kernel_b`; the layer
then computes with `kernel + (lora_alpha / lora_rank) * a @ b` (keras 3.15.1;
the factor is 1 where the layer has no `lora_alpha`, which Keras added with
that argument, so its absence is the feature test). Keras offers no public
way to merge the adapters into the kernel and switch LoRA off (its
`save_own_variables` writes the merged kernel to a file, not to the
layer), so the export merges them itself: the frozen kernel is the private
variable `_kernel` behind the `kernel` property, and `lora_enabled` is the
attribute the layer's call reads (both checked on keras 3.10.0 and 3.15.1).
"""

import keras
import numpy as np

from kerasnorm._compat.keras_private import sublayers


def lora_layers(model):
    """The layers of `model` (nested ones included) with LoRA enabled."""
    layers = [model, *sublayers(model, recursive=True)]
    return [layer for layer in layers if getattr(layer, "lora_enabled", False)]


def lora_variables(layer):
    """`(kernel, a, b)`: the frozen kernel variable and the two adapters."""
    kernel = getattr(layer, "_kernel", None)
    if kernel is None:
        raise ValueError(
            f"layer {layer.name!r} ({type(layer).__name__}) has LoRA enabled on "
            "a kernel that is not a float variable (quantized: "
            f"{getattr(layer, 'quantization_mode', None)!r}); merge or remove "
            "its adapters before exporting."
        )
    return kernel, layer.lora_kernel_a, layer.lora_kernel_b


def kernel_variable(layer):
    """The float kernel variable behind a `Dense` / `EinsumDense`'s
    `kernel` property (LoRA's adapters never added), or None."""
    kernel = getattr(layer, "_kernel", None)
    return kernel if isinstance(kernel, keras.Variable) else None


def merged_kernel(layer):
    """The kernel the layer computes with, `kernel + scale * a @ b`, summed
    in float64 from the variables' values, as float32 (a bfloat16 kernel and
    adapters are exact in float64)."""
    kernel, a, b = lora_variables(layer)
    alpha = getattr(layer, "lora_alpha", None)
    scale = 1.0 if alpha is None else alpha / layer.lora_rank
    value = _numpy(kernel) + scale * np.matmul(_numpy(a), _numpy(b))
    return value.astype(np.float32)


def set_lora_enabled(layer, enabled):
    """Switch the layer's LoRA path on or off (its adapters are kept)."""
    layer.lora_enabled = bool(enabled)


def _numpy(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable.value), np.float64)
