"""What the export commands read: the `.keras` model and the inputs files.

The `.keras` archive itself is checked by `kerasnorm_cli.checks` before
Keras is imported; here it is loaded. Inputs files come back in the model's
own input structure (a dict by key for a dict model, a list for a list of
inputs, one array for one input), checked against the model's inputs by
`kerasnorm.export.model_inputs`, with errors naming the command's flag.
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
    per input, by input name (dict key for a dict model), or unnamed in
    order (`np.savez(f, a, b)`): `kerasnorm.export.model_inputs` reads it,
    its refusals naming `flag`.
    """
    if path is None:
        return None
    from kerasnorm.export import model_inputs

    return model_inputs(model, read_arrays(path, flag), argument=flag)


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
