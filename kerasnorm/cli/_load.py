"""What the export commands read: the `.keras` model and the inputs files.

The `.keras` archive itself is checked by `kerasnorm_cli.checks` before
Keras is imported; here it is loaded. Inputs files come back in the model's
own input structure (a dict by key for a dict model, a list for a list of
inputs, one array for one input), checked against the model's inputs by
`kerasnorm.export.model_inputs`, with errors naming the command's flag.
"""

from __future__ import annotations

import os
import sys


def load_model(path, *, imports=(), safe_mode=True, command="export"):
    """The model in the `.keras` file at `path` (archive already checked),
    after importing the modules `imports` (`--import`: names or `.py`
    paths), so that the classes and functions they register with
    `keras.saving.register_keras_serializable` resolve.

    `safe_mode=True`: no lambda's bytecode runs; `--no-safe-mode` passes
    False, with a one-line warning on stderr. `compile=False`: the export
    never trains, so the optimizer's state stays in the file (loading it
    warns "Skipping variable loading for optimizer" for a model saved before
    its first step); `kerasnorm qat` compiles its own copy.
    """
    import keras

    for value in imports:
        import_module(value)
    if not safe_mode:
        print(
            f"kerasnorm {command}: warning: --no-safe-mode: loading {path} runs "
            "the Python code stored in it (its Lambda layers); use it only on "
            "files you trust.",
            file=sys.stderr,
        )
    try:
        return keras.saving.load_model(path, safe_mode=safe_mode, compile=False)
    except Exception as err:
        raise ValueError(
            f"{path!r} could not be loaded ({type(err).__name__}: {err})"
            + _load_hint(str(err), safe_mode)
        ) from err


def load_preset(path, *, imports=(), command="export"):
    """The keras-hub model in the preset folder `path` (`save_to_preset`'s,
    already checked): its task (a CausalLM with its preprocessor) where the
    folder has a `task.json`, else its backbone. Loaded from the folder
    alone: a local path never reaches the network (keras-hub downloads only
    for `kaggle://` / `hf://` handles and preset names)."""
    for value in imports:
        import_module(value)
    try:
        import keras_hub
    except ImportError as err:
        raise ValueError(
            f"{path!r} is a keras-hub preset folder, and keras-hub is not "
            'installed: pip install "kerasnorm[litert_lm]".'
        ) from err
    import json

    local = os.path.abspath(path)
    task = os.path.join(local, "task.json")
    try:
        if os.path.isfile(task):
            # The task's own class: keras-hub refuses `Task.from_preset`.
            with open(task, encoding="utf-8") as f:
                name = json.load(f).get("class_name", "")
            cls = getattr(keras_hub.models, name, None) or keras_hub.models.CausalLM
            return cls.from_preset(local)
        return keras_hub.models.Backbone.from_preset(local)
    except Exception as err:
        raise ValueError(
            f"{path!r} could not be loaded as a keras-hub preset "
            f"({type(err).__name__}: {err})"
        ) from err


def _load_hint(message, safe_mode):
    """What the command's own flags can do about a load failure."""
    if "Could not locate" in message:
        return (
            ". If your own code defines it, pass --import MODULE (a module "
            "name or a .py file) that defines and registers it"
        )
    if safe_mode and "safe_mode" in message:
        return ". Pass --no-safe-mode if you trust the file"
    return ""


def import_module(value):
    """Import `--import`'s `value`: a `.py` file by path (its directory
    put first on `sys.path`, as when Python runs it, so that its own
    imports resolve), else a module by name. ValueError naming the flag
    when it fails."""
    import importlib
    import importlib.util

    try:
        if value.endswith(".py") or os.sep in value:
            path = os.path.abspath(value)
            directory, name = os.path.split(os.path.splitext(path)[0])
            if directory not in sys.path:
                sys.path.insert(0, directory)
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(value)
    except Exception as err:
        raise ValueError(
            f"--import {value} failed ({type(err).__name__}: {err})"
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


def with_lora_weights(model, path):
    """`model` (the base keras-hub CausalLM) with the LoRA adapters of
    `path` (`backbone.save_lora_weights`'). `model` must be the base the
    adapters were trained on: Keras saves a LoRA model's kernels with the
    adapters merged in, and a keras-hub backbone's config carries no LoRA,
    so a fine-tune saved whole loads as a plain model of merged weights."""
    if path is None:
        return model
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise ValueError(
            f"--lora-weights loads into a keras-hub CausalLM's backbone; "
            f"{model.name!r} has none."
        )
    backbone.load_lora_weights(path)
    return model


def load_drafter(args):
    """The assistant `--drafter` names (a keras-hub preset folder, already
    checked), loaded as the base is, or None; ValueError naming the flag
    where it does not load (whether it drafts for the base, `to_litert_lm`
    judges first)."""
    path = getattr(args, "drafter", None)
    if path is None:
        return None
    try:
        return load_preset(path, command="export")
    except ValueError as err:
        raise ValueError(f"--drafter {err}") from err


def load_for(args, command):
    """The model a command's `MODEL` argument names (a keras-hub preset
    folder, or a `.keras`/`.h5` file loaded with `--import` and
    `--no-safe-mode` as given), with `--lora-weights` loaded into it where
    the command has that flag."""
    if os.path.isdir(args.model):
        model = load_preset(args.model, imports=args.imports, command=command)
    else:
        model = load_model(
            args.model,
            imports=args.imports,
            safe_mode=not args.no_safe_mode,
            command=command,
        )
    return with_lora_weights(model, getattr(args, "lora_weights", None))
