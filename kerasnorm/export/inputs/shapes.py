"""The shapes an artifact's inputs take: which dimensions stay dynamic.

A dimension the model leaves undefined (the batch, a sequence length, an
image size) stays dynamic in the artifact (`None` here, `-1` in a `.tflite`
file's `shape_signature`), as Keras' own exporter writes it. `batch_size`
fixes the batch; `input_signature` (Keras' name and forms: `keras.InputSpec`
or `tf.TensorSpec` per input, or plain shape tuples) fixes any other
undefined dimension. A dimension the model defines cannot be changed.

A TFLite file of a model with a recurrent layer is written at a fixed
batch, 1 unless `batch_size` says otherwise (`RECURRENT_BATCH`): the
converter lowers a rolled loop's tensor lists (a `WHILE`) to builtin ops
only for a known batch, and an unrolled layer's zero initial state, a
`FILL` of a dynamic batch, gets a zero scale in the full-integer modes
(which TFLite's kernels abort on). Its sequence length may stay dynamic.
The file of a calibrated mode (`modes.Mode.calibrates`) is written at
batch 1 too unless `batch_size` says otherwise (`CALIBRATED_BATCH`); its
other dimensions follow the rule.
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm.export.model.facts import has_recurrent_layer

# The batch of a TFLite file of a model with a recurrent layer when
# `batch_size` is None (see the module docstring).
RECURRENT_BATCH = 1
# The batch of a calibrated mode's TFLite file when `batch_size` is None:
# at a dynamic batch, the trained masked token encoder's fast int8 file
# failed its check (rms error 1.27 of the output, 59 % accuracy, against
# 0.008 and 100 % at batch 1: the mask's fill is built at run time there).
CALIBRATED_BATCH = 1


def fixed_batch(*, calibrated, recurrent):
    """The batch of a file that neither `batch_size` nor the signature
    fixes: `CALIBRATED_BATCH` for a calibrated mode's TFLite file,
    `RECURRENT_BATCH` for a whole-sequence TFLite file of a model with a
    recurrent layer, else None (dynamic)."""
    if calibrated:
        return CALIBRATED_BATCH
    return RECURRENT_BATCH if recurrent else None


def model_file_shapes(model, spec, *, batch_size=None, input_signature=None):
    """`file_shapes` of a `.tflite` file of `model` (its inputs `spec`):
    batch `RECURRENT_BATCH` for a model with a recurrent layer when neither
    `batch_size` nor the signature fixes it."""
    fixed = RECURRENT_BATCH if has_recurrent_layer(model) else None
    return file_shapes(
        spec,
        batch_size=batch_size,
        input_signature=input_signature,
        fixed_batch=fixed,
    )


def file_shapes(spec, *, batch_size=None, input_signature=None, fixed_batch=None):
    """The artifact's input shapes, in `spec.tensors` order: the model's
    shapes with the batch `batch_size` (else the signature's, else
    `fixed_batch`, else dynamic) and the undefined dimensions the signature
    fixes. `None` is a dynamic dimension.

    Raises ValueError, naming the input and the dimension, for a signature
    that does not fit the model.
    """
    given = parse_input_signature(spec, input_signature)
    shapes = []
    for x, name, wanted in zip(spec.tensors, spec.names, given, strict=True):
        model_shape = tuple(x.shape)
        shape = list(model_shape)
        shape[0] = None
        if wanted is not None:
            shape = _fixed(name, model_shape, wanted, batch_size)
        if batch_size is not None:
            shape[0] = batch_size
        elif shape[0] is None and fixed_batch is not None:
            shape[0] = fixed_batch
        shapes.append(tuple(shape))
    return tuple(shapes)


def parse_input_signature(spec, input_signature):
    """Per input of `spec` (flat, in its order), the shape `input_signature`
    gives for it, or None where it gives none.

    Forms (Keras' `model.export(..., input_signature=...)` and
    `ExportArchive.add_endpoint` take the first three): a list with one
    element, the model's input structure of specs (`[{"token_ids": spec,
    ...}]`, `[[spec_a, spec_b]]`); a list of specs in `model.inputs` order;
    one spec for a one-input model; a dict by input name (signature name,
    dict key or Input name) holding a spec for some or all of the inputs. A
    spec is a `keras.InputSpec`, a `tf.TensorSpec` or a shape (a tuple of
    ints and None), batch first.
    """
    if input_signature is None:
        return [None] * len(spec.tensors)
    signature = input_signature
    if _is_list(signature) and len(signature) == 1 and not _is_leaf(signature[0]):
        signature = signature[0]  # Keras' one positional argument
    if isinstance(signature, dict):
        return _by_name(spec, signature)
    if _is_leaf(signature):
        signature = [signature]
    if not _is_list(signature) or len(signature) != len(spec.tensors):
        raise ValueError(
            f"input_signature should give one shape per model input "
            f"({', '.join(spec.names)}): a list in that order, a dict by "
            "name, or (one input) one spec, each a keras.InputSpec, a "
            f"tf.TensorSpec or a shape tuple. Received: {input_signature!r}"
        )
    pairs = zip(signature, spec.names, spec.dtypes(), strict=True)
    return [_shape_of(leaf, name, dtype) for leaf, name, dtype in pairs]


def _by_name(spec, signature):
    keys = spec.keys or [None] * len(spec.tensors)
    found, used = [], set()
    for x, name, key, dtype in zip(
        spec.tensors, spec.names, keys, spec.dtypes(), strict=True
    ):
        hit = next((k for k in (key, name, x.name) if k in signature), None)
        found.append(None if hit is None else _shape_of(signature[hit], name, dtype))
        used.add(hit)
    unknown = sorted(set(signature) - used, key=str)
    if unknown:
        raise ValueError(
            f"input_signature names {unknown}, which are not inputs of the "
            f"model; its inputs are {list(spec.names)}."
        )
    return found


def _is_list(value):
    return isinstance(value, (list, tuple))


def _is_shape(value):
    return _is_list(value) and all(
        d is None or isinstance(d, (int, np.integer)) for d in value
    )


def _is_leaf(value):
    return _is_shape(value) or hasattr(value, "shape")


def _shape_of(leaf, name, dtype):
    """The shape of one spec; a spec's dtype must be the input's."""
    if _is_shape(leaf):
        return tuple(None if d is None else int(d) for d in leaf)
    shape = getattr(leaf, "shape", None)
    if shape is None:
        raise ValueError(
            f"input_signature for input {name!r} should be a keras.InputSpec, "
            f"a tf.TensorSpec or a shape tuple with its rank. Received: {leaf!r}"
        )
    given = getattr(leaf, "dtype", None)
    if given is not None and keras.backend.standardize_dtype(given) != dtype:
        raise ValueError(
            f"input_signature gives input {name!r} the dtype "
            f"{keras.backend.standardize_dtype(given)}, but the model takes "
            f"{dtype}: the input's dtype is the model's. Give its spec that "
            "dtype, or a plain shape tuple."
        )
    return tuple(None if d is None else int(d) for d in shape)


def _fixed(name, model_shape, wanted, batch_size):
    if len(wanted) != len(model_shape):
        raise ValueError(
            f"input_signature gives input {name!r} the shape {wanted}, of rank "
            f"{len(wanted)}; the model's input has shape {model_shape}, rank "
            f"{len(model_shape)} (batch first)."
        )
    shape = [None if d is None else int(d) for d in wanted]
    if shape[0] is not None and batch_size is not None and shape[0] != batch_size:
        raise ValueError(
            f"input_signature gives input {name!r} the batch {shape[0]} and "
            f"batch_size={batch_size} another: give one of them."
        )
    for axis in range(1, len(shape)):
        model_dim, dim = model_shape[axis], shape[axis]
        if dim is not None and dim < 1:
            raise ValueError(
                f"input_signature gives input {name!r} dimension {axis} the size "
                f"{dim}; sizes are positive (None keeps it dynamic)."
            )
        if model_dim is None or dim == model_dim:
            continue
        if dim is None:
            shape[axis] = model_dim  # defined by the model: nothing to fix
            continue
        raise ValueError(
            f"input_signature gives input {name!r} dimension {axis} the size "
            f"{dim}, but the model defines it as {model_dim} (input shape "
            f"{model_shape}): input_signature fixes undefined (None) "
            "dimensions only."
        )
    return shape
