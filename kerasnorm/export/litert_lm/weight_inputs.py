"""Large weights kept out of the converter: traced as signature inputs,
written into the file after it.

LiteRT's converter reads every weight it is given into constants of its
own and writes them out again: for a model of W bytes of float32 weights
it holds ~3 W above its start (the SavedModel's variables, the frozen
constants, the file). Here each large weight (`INPUT_WEIGHT_BYTES` and
over) is traced as an input of every signature instead
(`keras.StatelessScope` maps the variable to the input while the step is
traced), so the converter sees a graph of a few megabytes. In the file it
writes, `weights.placement.place_weights` (a flatbuffer rewrite) replaces
each input by a constant of the variable's values, through the reshapes
and transposes the converter put between the input and its readers (an
`EinsumDense` kernel `(hidden, heads, head_dim)` flattened, or transposed
first).

A reader that rewrite does not write as a constant raises
`weights.placement.Unplaced`: the writer then converts the
model with its weights as constants, as before (`write.write_generative`).
Either way the file is checked against the Keras model by generating
(`check`).
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

from kerasnorm.export.weights.placement import PREFIX

# Float32 variables of at least this many bytes are traced as inputs: the
# ones that decide the converter's memory (a 1B model's embedding table is
# 1 GiB, its kernels 16-64 MiB); the small ones (norm gains) stay
# constants the converter folds as before.
INPUT_WEIGHT_BYTES = 2**20


def large_variables(variables, threshold=None, matrices=False):
    """The float32 variables of `variables` of at least `threshold` bytes
    (`INPUT_WEIGHT_BYTES` when None), each once (a tied table is one
    variable); with `matrices`, every float32 variable of two or more
    dimensions too (a quantized file's kernels, whatever their size:
    the converter folds a norm's gain into a constant kernel that reads
    it, `W * g`, and int8 rows of that product round the channels the
    gain shrinks coarsely; SmolLM2-135M-Instruct's key and value kernels,
    0.44 MB each, cost its weight-only int8 file 0.949 top-1 agreement
    against 0.982 unfolded, docs/benchmarks.md "Real models")."""
    threshold = INPUT_WEIGHT_BYTES if threshold is None else threshold
    seen, large = set(), []
    for variable in variables:
        if id(variable) in seen or variable.dtype != "float32":
            continue
        seen.add(id(variable))
        if 4 * int(np.prod(variable.shape)) >= threshold or (
            matrices and len(variable.shape) >= 2
        ):
            large.append(variable)
    return large


def placed_bytes(weights):
    """The float32 bytes of `weights` (Keras variables)."""
    return sum(4 * int(np.prod(w.shape)) for w in weights)


def input_specs(weights):
    """The `tf.TensorSpec`s of `weights` as signature inputs, named
    `PREFIX<k>`."""
    import tensorflow as tf

    return [
        tf.TensorSpec(tuple(w.shape), tf.float32, name=f"{PREFIX}{k}")
        for k, w in enumerate(weights)
    ]


@contextlib.contextmanager
def read_from(weights, tensors):
    """While active, each of `weights` (Keras variables, or fused products'
    weights, `fused_products.FusedProduct`) reads as the matching tensor of
    `tensors` (the traced inputs)."""
    pairs = list(zip(weights, tensors, strict=True))
    variables = [(w, t) for w, t in pairs if isinstance(w, keras.Variable)]
    with contextlib.ExitStack() as stack:
        for w, t in pairs:
            if not isinstance(w, keras.Variable):
                stack.enter_context(w.read_as(t))
        with keras.StatelessScope(state_mapping=variables):
            yield
