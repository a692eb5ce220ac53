"""A model's inputs: their names, structure and shapes, and user data
(arrays, lists, dicts, `.npz` archives, datasets) converted to them.

Every stage of an export reads the inputs through one `InputSpec`: flat
lists of arrays in `keras.tree.flatten` order of the model's input
structure (which is `model.inputs` order) travel between the stages, and
`InputSpec.pack` gives the model its own structure back (a dict for a
dict-input model) wherever the model is called.
"""

from __future__ import annotations

import collections.abc
import dataclasses

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm.export.naming.names import input_names

# Sizes tried, in turn, for an input dimension the model leaves undefined: a
# model may bound it (a position embedding of 16 positions).
SAMPLE_DIMS = (32, 16, 8, 4, 2, 1)
# The most samples read from a dataset.
DATASET_LIMIT = 10_000
# Samples of representative_data a check runs on when verify_inputs is None:
# enough that the check sees the tails of the int8 error, not only its
# typical size.
VERIFY_SAMPLES = 256
# Random samples a check runs on when it is given no inputs: more than a
# handful, so that one lucky draw does not decide (tracing and conversion,
# not these, dominate an export's time). Random inputs say little about real
# data: the verification says "random" (`Verification.checked_on`).
RANDOM_SAMPLES = 32


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """The inputs of one model: `structure` (its Input tensors as it takes
    them: one tensor, a list, a dict), `tensors` (flat, in `model.inputs`
    order) and their signature `names` (`names.input_names`)."""

    structure: object
    tensors: tuple
    names: tuple

    @classmethod
    def of(cls, model):
        graph = functional_of(model)
        if graph is not None:
            structure = graph.input
        else:  # a tf_keras model: one tensor or a list
            structure = model.inputs if len(model.inputs) > 1 else model.inputs[0]
        tensors = tuple(keras.tree.flatten(structure))
        return cls(structure, tensors, tuple(input_names(model)))

    @property
    def keys(self):
        """The keys of a dict-input model, else None."""
        return sorted(self.structure) if isinstance(self.structure, dict) else None

    def shapes(self, batch=None):
        return [(batch, *x.shape[1:]) for x in self.tensors]

    def dtypes(self):
        return [keras.backend.standardize_dtype(x.dtype) for x in self.tensors]

    def pack(self, arrays):
        """Flat `arrays` in the structure the model takes."""
        return keras.tree.pack_sequence_as(self.structure, list(arrays))

    def first_run(self, model, candidates):
        """`(arrays, failures)`: the first of `candidates` (flat input lists,
        made one at a time) that `model` runs on, or None, and the errors it
        raised on those before it."""
        failures = []
        for arrays in candidates:
            try:
                model(self.pack(arrays), training=False)
            except Exception as err:
                failures.append(err)
                continue
            return arrays, failures
        return None, failures

    def read(self, data, argument):
        """`data` as a flat list of arrays of the inputs' dtypes, checked.

        `data`: an array (one input), a list/tuple in `model.inputs` order, a
        mapping (a dict, an `.npz` archive) by input name or dict key, or a
        `tf.data.Dataset` of such batches (or of `(inputs, targets)`).
        `argument` is the Python argument named in errors.
        """
        if hasattr(data, "as_numpy_iterator"):
            arrays = self._from_batches(
                (self._batch_inputs(e) for e in data.as_numpy_iterator()),
                f"The dataset given as {argument}",
                argument,
            )
        elif (batches := self._batches(data)) is not None:
            arrays = self._from_batches(batches, argument, argument)
        else:
            arrays = self._arrays(data, argument)
        if len(arrays) != len(self.tensors):
            raise ValueError(
                f"{argument} has {len(arrays)} input array(s) but the model has "
                f"{len(self.tensors)} input(s) ({', '.join(self.names)}). "
                f"{self._forms()}"
            )
        for array, x, name in zip(arrays, self.tensors, self.names, strict=True):
            expected = tuple(x.shape)
            ok = array.ndim == len(expected) and all(
                e is None or e == a
                for e, a in zip(expected[1:], array.shape[1:], strict=True)
            )
            if not ok or len(array) == 0:
                raise ValueError(
                    f"{argument} for input {name!r} should have shape "
                    f"(N, {', '.join(str(d) for d in expected[1:])}) with N >= 1. "
                    f"Received shape {array.shape}."
                )
        if len({len(a) for a in arrays}) > 1:
            counts = ", ".join(
                f"{name}: {len(a)}" for name, a in zip(self.names, arrays, strict=True)
            )
            raise ValueError(
                f"{argument} holds different numbers of samples for the inputs "
                f"({counts})."
            )
        return [a.astype(d) for a, d in zip(arrays, self.dtypes(), strict=True)]

    def _forms(self):
        return f"Give a dict keyed by {list(self.names)}, a list in that order" + (
            ", or one array." if len(self.names) == 1 else "."
        )

    def _arrays(self, data, argument):
        if isinstance(data, collections.abc.Mapping):
            return [np.asarray(a) for a in self._by_name(data, argument)]
        if isinstance(data, (list, tuple)):
            return [np.asarray(a) for a in data]
        return [np.asarray(data)]

    def _by_name(self, data, argument):
        """The arrays of mapping `data`, found under each input's signature
        name, dict key or Input name; in order when its keys are `np.savez`'s
        names for unnamed arrays (`arr_0`, `arr_1`, ...), or when it holds
        the one array of a one-input model under another name."""
        given = list(data)
        if given == [f"arr_{i}" for i in range(len(given))] or (
            len(given) == len(self.tensors) == 1
        ):
            return [data[key] for key in given]
        found, missing = [], []
        keys = self.keys or [None] * len(self.tensors)
        for x, name, own in zip(self.tensors, self.names, keys, strict=True):
            key = next((k for k in (own, name, x.name) if k in data), None)
            if key is None:
                missing.append(name)
            else:
                found.append(data[key])
        if missing:
            raise ValueError(
                f"{argument} is missing model input(s) {missing}. Received keys: "
                f"{sorted(data)}. {self._forms()}"
            )
        return found

    def _batches(self, data):
        """The batches of `data` when it is given as batches (the form
        `tf.lite.TFLiteConverter.representative_dataset` yields), else
        None: a callable returning an iterator of them, an iterator, or a
        list/tuple of batches, each a dict by input name, a list in
        `model.inputs` order or (a one-input model) an array. A list of
        arrays is a list of inputs unless the model has one input and the
        list holds several arrays."""
        if isinstance(data, (np.ndarray, collections.abc.Mapping, str, bytes)):
            return None
        if callable(data):
            data = data()
        if isinstance(data, (list, tuple)):
            nested = (collections.abc.Mapping, list, tuple)
            if data and all(isinstance(b, nested) for b in data):
                return data
            if len(self.tensors) == 1 and len(data) > 1:
                return data
            return None
        if isinstance(data, collections.abc.Iterator):
            return data
        return None

    def _from_batches(self, batches, what, argument):
        """The first `DATASET_LIMIT` samples of `batches` (each a batch of
        inputs in a form `_arrays` reads), concatenated. `what` names the
        data in errors."""
        stacked, count = [], 0
        for index, batch in enumerate(batches):
            if not isinstance(batch, (collections.abc.Mapping, list, tuple)) and (
                len(self.tensors) > 1 or not hasattr(batch, "shape")
            ):
                raise ValueError(
                    f"{what} holds a batch {index} of type "
                    f"{type(batch).__name__}; each batch should be "
                    f"{self._batch_form()}"
                )
            arrays = self._arrays(batch, argument)
            if len(arrays) != len(self.tensors):
                raise ValueError(
                    f"{what}: batch {index} has {len(arrays)} input array(s) but "
                    f"the model has {len(self.tensors)} input(s) "
                    f"({', '.join(self.names)}); each batch should be "
                    f"{self._batch_form()}"
                )
            stacked.append(arrays)
            count += len(arrays[0]) if arrays[0].ndim else 1
            if count >= DATASET_LIMIT:
                break
        if not stacked:
            raise ValueError(f"{what} is empty.")
        for parts, name in zip(zip(*stacked, strict=True), self.names, strict=True):
            shapes = sorted({p.shape[1:] for p in parts})
            if len(shapes) > 1:
                raise ValueError(
                    f"{what} holds batches of input "
                    f"{name!r} of different shapes {shapes[:4]} (batch aside): "
                    "its samples are read as one array. Any length the model "
                    "takes works, one per array: pad the sequences to one "
                    "length (padded_batch to a fixed padded_shapes), or give "
                    "an array."
                )
        return [np.concatenate(parts) for parts in zip(*stacked, strict=True)]

    def _batch_form(self):
        one = " or one array" if len(self.names) == 1 else ""
        return (
            f"a dict keyed by {list(self.names)}, a list in that order{one}, "
            "batch first."
        )

    def _batch_inputs(self, element):
        if not isinstance(element, (list, tuple)):
            return element
        nested = isinstance(element[0], (list, tuple, dict))
        if nested or (len(self.tensors) == 1 and len(element) in (2, 3)):
            return element[0]  # (inputs, targets)
        return element


def check_fits(arrays, shapes, names, argument):
    """Refuse `arrays` (flat inputs) whose size differs from a dimension the
    artifact's `shapes` fix (batch aside: inputs are run in batches)."""
    for x, shape, name in zip(arrays, shapes, names, strict=True):
        for axis in range(1, min(len(shape), x.ndim)):
            if shape[axis] is not None and x.shape[axis] != shape[axis]:
                raise ValueError(
                    f"{argument} for input {name!r} has shape {x.shape}, but the "
                    f"artifact fixes its dimension {axis} at {shape[axis]} "
                    f"(input shape {tuple(shape)}): give {argument} of that "
                    "size, or leave the dimension dynamic (None in "
                    "input_signature)."
                )


def model_inputs(model, data, *, argument="data"):
    """`data` converted to the inputs `model` takes, in its own structure.

    `data` may be an array (a one-input model), a list or tuple of arrays
    in `model.inputs` order, a mapping by input name (a dict, an `.npz`
    archive; a dict-input model's keys are its input names; an archive of
    unnamed arrays, `np.savez(f, a, b)`, is read in order), or a
    `tf.data.Dataset` of batches of any of these or of `(inputs, targets)`
    (at most 10,000 samples are read). Arrays are batch first and cast to
    the inputs' dtypes; their shapes are checked against the model's, and
    every input must hold the same number of samples.

    Returns a single array, a list or a dict, as `model` takes it: `model(
    model_inputs(model, data))` runs. Raises ValueError naming `argument`
    (the Python argument the data came in) and the input at fault.
    """
    spec = InputSpec.of(model)
    return spec.pack(spec.read(data, argument))


def sample_inputs(model, batch, seed=0, sizes=SAMPLE_DIMS, shapes=None, *, layers):
    """Random inputs the model runs on, flat in `model.inputs` order: what
    every check runs on when it is given no inputs.

    Floats are standard normal; integers lie below the smallest
    `Embedding.input_dim` in the model (so that every embedding accepts
    them), or in {0, 1} without one. An undefined dimension is the first of
    `sizes` the model runs on; when none works the error names the input and
    the dimension. `shapes` (an artifact's input shapes, batch first) fix
    some of those dimensions. `layers`: every layer of `model`
    (`model.all_layers`), which the caller has derived.
    """
    spec = InputSpec.of(model)
    dims = [tuple(x.shape) for x in spec.tensors] if shapes is None else shapes
    high = min(
        (layer.input_dim for layer in layers if type(layer) is keras.layers.Embedding),
        default=2,
    )
    undefined = [
        (name, axis)
        for shape, name in zip(dims, spec.names, strict=True)
        for axis, d in enumerate(shape)
        if d is None and axis > 0
    ]

    def sample(size):
        rng = np.random.default_rng(seed)
        arrays = []
        for x, name, own in zip(spec.tensors, spec.names, dims, strict=True):
            shape = (batch, *(size if d is None else d for d in own[1:]))
            dtype = keras.backend.standardize_dtype(x.dtype)
            if "float" in dtype:
                arrays.append(rng.standard_normal(shape).astype(dtype))
            elif "int" in dtype or dtype == "bool":
                arrays.append(rng.integers(0, high, shape).astype(dtype))
            else:
                raise ValueError(
                    f"Cannot make a random sample for input {name!r} of "
                    f"dtype {dtype}; pass verify_inputs= with valid inputs."
                )
        return arrays

    if not undefined:
        return sample(None)
    arrays, failures = spec.first_run(model, (sample(size) for size in sizes))
    if arrays is not None:
        return arrays
    where = ", ".join(f"input {name!r} dimension {axis}" for name, axis in undefined)
    raise ValueError(
        f"Cannot invent inputs that model {model.name!r} runs on: {where} is "
        f"undefined, and the model failed at every size tried "
        f"({', '.join(map(str, sizes))}); pass verify_inputs= with "
        f"valid inputs. At size {sizes[-1]} it raised: {failures[-1]}"
    ) from failures[-1]


def inputs_to_check(
    model,
    data,
    *,
    calibration=None,
    batch_size=1,
    samples=RANDOM_SAMPLES,
    sizes=SAMPLE_DIMS,
    argument="verify_inputs",
    shapes=None,
    layers,
):
    """What a check runs on, flat, and where it came from: the one rule.

    `data` (the user's `verify_inputs`, checked) when given; else the first
    `VERIFY_SAMPLES` (at least `batch_size`) of `calibration` (the flat
    `representative_data` of a `to_tflite` export); else `samples` random
    ones (`sample_inputs`; `sizes` for an undefined dimension, the sequence
    length of a streaming export; `shapes`, an artifact's input shapes,
    fix some). The second value is
    `Verification.checked_on`: "verify_inputs", "representative_data" or
    "random". `layers`: as `sample_inputs` takes them.
    """
    if data is not None:
        return InputSpec.of(model).read(data, argument), "verify_inputs"
    batch_size = batch_size or 1
    if calibration is not None:
        head = [x[: max(batch_size, VERIFY_SAMPLES)] for x in calibration]
        return head, "representative_data"
    samples = max(batch_size, samples)
    sampled = sample_inputs(model, samples, sizes=sizes, shapes=shapes, layers=layers)
    return sampled, "random"
