"""The weights an export writes: LoRA adapters merged into their kernels,
and the float32 copy of a model held in half precision.

A model fine-tuned with LoRA (`enable_lora` on `Dense` / `EinsumDense`, as
keras-hub's `backbone.enable_lora(rank)` does) computes each adapted layer
as `x @ kernel + scale * (x @ a) @ b`. The file is written from `kernel +
scale * a @ b`, the same function in one product: no bigger and no slower
than the model without LoRA. `merged_lora` merges in place while the file
is written and puts every kernel and switch back on exit, an error
included, so the user's model is left as it was; the file is verified
afterwards against the LoRA model's own output.

A model held in `bfloat16` / `float16` (or a mixed policy) is written from
its float32 copy (`numerics.precision.rebuild`: the same weights, exact in
float32): TFLite's builtin kernels compute in float32.
"""

from __future__ import annotations

import contextlib

import keras

from kerasnorm._compat.keras_lora import lora_layers
from kerasnorm._compat.keras_lora import lora_variables
from kerasnorm._compat.keras_lora import merged_kernel
from kerasnorm._compat.keras_lora import set_lora_enabled
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.numerics import precision


@contextlib.contextmanager
def merged_lora(model):
    """While active, each LoRA layer of `model` holds its merged kernel and
    computes without its adapters; yields their names. Restored on exit."""
    layers = lora_layers(model)
    saved = []
    try:
        for layer in layers:
            kernel, _, _ = lora_variables(layer)
            merged = merged_kernel(layer)
            saved.append((layer, kernel, keras.ops.convert_to_numpy(kernel.value)))
            kernel.assign(merged.astype(kernel.dtype))
            set_lora_enabled(layer, False)
        yield [layer.name for layer in layers]
    finally:
        for layer, kernel, value in reversed(saved):
            kernel.assign(value)
            set_lora_enabled(layer, True)


def float_copy(model):
    """`precision.Rebuild` of a model that computes in half precision (its
    float32 copy), or None for a float32 model."""
    return precision.rebuild(model, "float32", layers=tuple(all_layers(model)))
