"""The products that read one input, as one product in the cached step:
query/key/value, a gated feed-forward's gate and up (docs/design.md,
"Products that read one input").

keras-hub's decoders compute each projection with a layer of its own
(`Dense`, `EinsumDense`): query, key and value, gate and up are five
`FULLY_CONNECTED`s a block reading two inputs, each quantizing its input
again in a dynamic-int8 file. While a step is traced (`fused_calls`), the
layers that read the same tensor compute one product of their kernels
concatenated along the output axis (`FusedProduct`: one weight, `(in,
out_1 + out_2 + ...)`, its values concatenated in NumPy, never in the
graph), split after into each layer's output (parts of one size by one
`SPLIT`, others by slices: XNNPACK takes no `SPLIT_V`); biases are
concatenated alike. SmolLM2-135M's decode step: 121 `FULLY_CONNECTED`s
where it had 211. Each output column is the same dot product as before,
and every weights pass keyed per output row (int8 per channel, int4
blocks along the input) or per input (GPTQ's Hessian, `calibrate`)
treats the fused product as its parts.

Which layers read one input is seen, not assumed: the model's own cached
call runs once eagerly (`product_groups`, while `_build_cache` seeds a
cache) and every layer handed the same tensor object joins one group.
Fused only where it stays exact, and left as it is otherwise: a layer with
an activation, a float32 kernel it does not compute with (Keras-quantized,
half precision), a mixed bias, or an equation whose output is not the
input's free axes then the kernel's. A layer called with another tensor
than its group's, or with LoRA on, computes alone.

Runtime LoRA (`runtime_lora.RuntimeLora.fed`) wraps each adapted layer's
call around this one (`write` enters `fused_calls` first), so each part
gains its adapter's product after the split.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import ops

from kerasnorm._compat.hub_cache import call_replaced
from kerasnorm._compat.hub_cache import empty_cache
from kerasnorm._compat.keras_lora import kernel_variable
from kerasnorm._compat.keras_private import sublayers

# Off for measurements only (`export/bench_engine.py`): every mode fuses.
FUSE = True


class FusedProduct:
    """Layers that read one input, as one product: its weight `(in, out)`
    (`shape`, `value`), read from a traced input (`read_as`) or else a
    variable of the concatenated kernels made once."""

    def __init__(self, layers, specs):
        self.layers = tuple(layers)
        self.specs = tuple(specs)  # `_Spec` of each layer
        self.kernels = tuple(kernel_variable(layer) for layer in layers)
        self.sizes = [int(np.prod(s.out_shape)) for s in specs]
        self.shape = (specs[0].size_in, sum(self.sizes))
        self.dtype = "float32"
        self._traced = None
        self._variable = None
        self._active = False
        self._pending = {}

    @property
    def value(self):
        """The fused kernel `(in, out)`, from the variables' values now."""
        return np.concatenate(
            [s.matrix(k) for s, k in zip(self.specs, self.kernels, strict=True)],
            axis=1,
        )

    def out_in(self):
        """The product's `(out, in)` weights, as the file's
        `FULLY_CONNECTED` holds them (`weights.int_weights.weights_key`)."""
        return np.ascontiguousarray(self.value.T)

    @contextlib.contextmanager
    def read_as(self, tensor):
        """While active, the fused kernel is `tensor` (a traced input)."""
        self._traced = tensor
        try:
            yield
        finally:
            self._traced = None

    def _kernel(self):
        if self._traced is not None:
            return self._traced
        if self._variable is None:
            import tensorflow as tf

            with tf.init_scope():
                self._variable = tf.Variable(self.value, trainable=False)
        return self._variable

    def _bias(self):
        biases = [layer.bias for layer in self.layers]
        if biases[0] is None:
            return None
        return ops.concatenate(
            [
                ops.reshape(ops.broadcast_to(b, s.out_shape), (-1,))
                for b, s in zip(biases, self.specs, strict=True)
            ]
        )

    def outputs(self, x):
        """Each layer's output on `x`: one product, split."""
        spec = self.specs[0]
        lead = tuple(x.shape[: len(x.shape) - spec.axes_in])
        y = ops.matmul(ops.reshape(x, (*lead, spec.size_in)), self._kernel())
        bias = self._bias()
        if bias is not None:
            y = y + bias
        if len(set(self.sizes)) == 1:  # gate/up: one SPLIT
            parts = ops.split(y, len(self.sizes), axis=-1)
        else:  # slices: XNNPACK takes no SPLIT_V
            parts, start = [], 0
            for size in self.sizes:
                parts.append(y[..., start : start + size])
                start += size
        return [
            ops.reshape(part, (*lead, *s.out_shape))
            for part, s in zip(parts, self.specs, strict=True)
        ]

    def call(self, index):
        """Layer `index`'s call while `fused_calls` is active."""

        def call(original, inputs, *args, **kwargs):
            pending = self._pending.pop(index, None)
            if args or set(kwargs) - {"training"}:
                return original(inputs, *args, **kwargs)
            if pending is not None and pending[0] is inputs:
                return pending[1]
            if any(getattr(layer, "lora_enabled", False) for layer in self.layers):
                return original(inputs, *args, **kwargs)
            outputs = self.outputs(inputs)
            self._pending = {
                j: (inputs, y) for j, y in enumerate(outputs) if j != index
            }
            return outputs[index]

        return call


class _Spec:
    """How a layer's product reads its input: `axes_in` trailing axes of
    `size_in` contracted, `out_shape` its kernel's free axes; `matrix`
    its kernel as `(in, out)`."""

    def __init__(self, axes_in, shape_in, out_shape, order):
        self.axes_in = axes_in
        self.shape_in = tuple(shape_in)
        self.size_in = int(np.prod(shape_in))
        self.out_shape = tuple(out_shape)
        self.order = tuple(order)  # the kernel's axes: contracted, then free

    def matrix(self, kernel):
        k = np.asarray(keras.ops.convert_to_numpy(kernel.value), np.float32)
        return np.transpose(k, self.order).reshape(self.size_in, -1)


def _spec(layer):
    """The layer's `_Spec`, or None where its product is not fused."""
    if not isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense):
        return None
    if getattr(layer, "quantization_mode", None) is not None:
        return None
    activation = getattr(layer, "activation", None)
    if activation not in (None, keras.activations.linear):
        return None
    kernel = kernel_variable(layer)
    if kernel is None or kernel.dtype != "float32" or layer.compute_dtype != "float32":
        return None
    shape = tuple(int(d) for d in kernel.shape)
    if isinstance(layer, keras.layers.EinsumDense):
        return _einsum_spec(layer.equation, shape)
    if isinstance(layer, keras.layers.Dense) and len(shape) == 2:
        return _Spec(1, shape[:1], shape[1:], (0, 1))
    return None


def _einsum_spec(equation, shape):
    """`_Spec` of `x, kernel -> out` where the kernel contracts the trailing
    axes of `x` and the output is `x`'s other axes then the kernel's free
    ones, in order; None otherwise."""
    equation = equation.replace(" ", "")
    if "." in equation or "->" not in equation:
        return None
    inputs, out = equation.split("->")
    x, w = inputs.split(",")
    if len(set(w)) != len(w) or len(set(x)) != len(x) or len(w) != len(shape):
        return None
    contracted = [c for c in x if c in w and c not in out]
    free_x = [c for c in x if c not in w]
    free_w = [c for c in w if c not in x]
    if (
        not contracted
        or list(x) != free_x + contracted
        or out != "".join(free_x + free_w)
        or len(contracted) + len(free_w) != len(w)
    ):
        return None
    order = [w.index(c) for c in contracted] + [w.index(c) for c in free_w]
    return _Spec(
        len(contracted),
        [shape[i] for i in order[: len(contracted)]],
        [shape[i] for i in order[len(contracted) :]],
        order,
    )


def product_groups(model):
    """The groups of `model`'s (a keras-hub CausalLM) `Dense` /
    `EinsumDense` layers that its cached call hands one tensor, each in
    call order, two layers or more; each layer in one group at most."""
    candidates, seen = [], set()
    for layer in sublayers(model, recursive=True):
        if id(layer) not in seen and _spec(layer) is not None:
            seen.add(id(layer))
            candidates.append(layer)
    readers, held, calls = {}, [], {}

    def record(layer):
        def call(original, inputs, *args, **kwargs):
            held.append(inputs)  # its id stays its own while the run lasts
            readers.setdefault(id(inputs), []).append(layer)
            calls[id(layer)] = calls.get(id(layer), 0) + 1
            return original(inputs, *args, **kwargs)

        return call

    try:
        with contextlib.ExitStack() as stack:
            for layer in candidates:
                stack.enter_context(call_replaced(layer, record(layer)))
            empty_cache(model, 2)
    except Exception:  # the step reports its own error; nothing fused
        readers = {}
    groups = [
        tuple(layers)
        for layers in readers.values()
        if len(layers) > 1 and all(calls[id(layer)] == 1 for layer in layers)
    ]
    return tuple(g for g in groups if _fusable(g))


def _fusable(layers):
    """Whether `layers` (each with a `_Spec`) read their input alike and
    all have a bias or none."""
    specs = [_spec(layer) for layer in layers]
    first = specs[0]
    return (
        all((s.axes_in, s.shape_in) == (first.axes_in, first.shape_in) for s in specs)
        and len({layer.bias is None for layer in layers}) == 1
    )


def fused_products(model):
    """A `FusedProduct` of each of `model`'s `product_groups` (none where
    `FUSE` is off)."""
    if not FUSE:
        return ()
    return tuple(
        FusedProduct(group, [_spec(layer) for layer in group])
        for group in product_groups(model)
    )


@contextlib.contextmanager
def fused_calls(fused):
    """While active, each layer of each of `fused` (`FusedProduct`s)
    computes through its product; a product already active stays as it is
    (`write` enters it outside runtime LoRA's calls, the step inside)."""
    with contextlib.ExitStack() as stack:
        for product in fused:
            if product._active:
                continue
            product._active = True
            stack.callback(_deactivated, product)
            for index, layer in enumerate(product.layers):
                stack.enter_context(call_replaced(layer, product.call(index)))
        yield


def _deactivated(product):
    product._active = False
    product._pending = {}


def fused_weights(weights, fused):
    """`weights` (the variables traced as inputs, `weight_inputs`) with the
    kernels of each of `fused` replaced by its one weight, where any of
    them is among them."""
    ids = {id(w) for w in weights}
    replaced = {}
    for product in fused:
        if any(id(k) in ids for k in product.kernels):
            for k in product.kernels:
                replaced[id(k)] = product
    out, placed = [], set()
    for w in weights:
        product = replaced.get(id(w))
        if product is None:
            out.append(w)
        elif id(product) not in placed:
            placed.add(id(product))
            out.append(product)
    return out
