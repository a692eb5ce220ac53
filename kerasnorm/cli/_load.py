"""What the export commands read: the `.keras` model and the inputs files.

The `.keras` archive itself is checked by `kerasnorm_cli.checks` before
Keras is imported; here it is loaded. Inputs files come back in the model's
own input structure (a dict by key for a dict model, a list for a list of
inputs, one array for one input), checked against the model's inputs, with
errors naming the command's flag.
"""

from __future__ import annotations


def load_model(path):
    """The model in the `.keras` file at `path` (archive already checked).

    `safe_mode=True`: no lambda's bytecode runs. `compile=False`: the export
    never trains, so the optimizer's state stays in the file (loading it
    warns "Skipping variable loading for optimizer" for a model saved before
    its first step); `kerasnorm qat` compiles its own copy.
    """
    import keras

    try:
        return keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as err:
        raise ValueError(
            f"{path!r} could not be loaded ({type(err).__name__}: {err})"
        ) from err


def load_inputs(path, model, flag):
    """The model inputs in the `.npy` / `.npz` file `path` (given as `flag`),
    in the model's input structure; None without a path.

    A `.npy` holds the one input of a one-input model; a `.npz` one array
    per input, by input name (dict key for a dict model), or else in order.
    """
    if path is None:
        return None
    return to_model_inputs(model, read_arrays(path, flag), flag)


def read_arrays(path, flag):
    """The array in a `.npy` file, or the arrays by name in a `.npz` file;
    ValueError naming `flag` when it cannot be read."""
    import zipfile

    import numpy as np

    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{flag} {path!r} could not be read ({type(err).__name__}: {err})"
        ) from err


def to_model_inputs(model, data, flag):
    """`data` (one array, or arrays by name or in order) in the model's input
    structure, each array checked against its input's shape and cast to its
    dtype; ValueError naming `flag` otherwise."""
    import keras
    import numpy as np

    keys, tensors = _inputs(model)
    if isinstance(data, dict):
        if set(keys) <= set(data):
            arrays = [data[k] for k in keys]
        else:
            arrays = list(data.values())
    else:
        arrays = [data]
    if len(arrays) != len(tensors):
        raise ValueError(
            f"{flag} holds {len(arrays)} array(s) ({', '.join(map(str, data))}) "
            f"but the model has {len(tensors)} input(s): "
            f"{', '.join(keys)}. Name the arrays after the inputs."
            if isinstance(data, dict)
            else f"{flag} holds one array but the model has {len(tensors)} "
            f"inputs ({', '.join(keys)}): give a .npz with one array each."
        )
    arrays = [np.asarray(a) for a in arrays]
    for key, array, tensor in zip(keys, arrays, tensors, strict=True):
        expected = tuple(tensor.shape)[1:]
        fits = array.ndim == len(expected) + 1 and all(
            e is None or e == a for e, a in zip(expected, array.shape[1:], strict=True)
        )
        if not fits or len(array) == 0:
            shape = ", ".join(str(d) for d in expected)
            raise ValueError(
                f"{flag}: the array for input {key!r} should have shape "
                f"(N, {shape}) with N >= 1. Received shape {array.shape}."
            )
    if len({len(a) for a in arrays}) > 1:
        counts = ", ".join(f"{k}: {len(a)}" for k, a in zip(keys, arrays, strict=True))
        raise ValueError(
            f"{flag}: the inputs' arrays hold different numbers of samples ({counts})."
        )
    arrays = [
        a.astype(keras.backend.standardize_dtype(t.dtype))
        for a, t in zip(arrays, tensors, strict=True)
    ]
    structure = _structure(model)
    if isinstance(structure, dict):
        return dict(zip(keys, arrays, strict=True))
    return arrays if isinstance(structure, (list, tuple)) else arrays[0]


def head(data, count):
    """The first `count` samples of inputs in a model's structure."""
    if isinstance(data, dict):
        return {k: v[:count] for k, v in data.items()}
    if isinstance(data, list):
        return [v[:count] for v in data]
    return data[:count]


def sample_count(data):
    """How many samples inputs in a model's structure hold."""
    if isinstance(data, dict):
        data = next(iter(data.values()))
    elif isinstance(data, list):
        data = data[0]
    return len(data)


def _structure(model):
    """`model.input`: a dict, a list or one tensor; one tensor for a model
    that has none to show (a Sequential not yet called)."""
    import keras

    if isinstance(model, keras.Sequential):
        return None
    try:
        return model.input
    except (AttributeError, ValueError):
        return None


def _inputs(model):
    """(keys, tensors): dict keys for a dict model, else the inputs' names."""
    structure = _structure(model)
    if isinstance(structure, dict):
        return list(structure), list(structure.values())
    return [t.name for t in model.inputs], list(model.inputs)
