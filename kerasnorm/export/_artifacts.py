"""What every exporter shares: model and data checks, atomic writes, results."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import tempfile

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm.export._fold_report import FoldReport

# Kept under their old names for code written against this module before
# the model helpers moved to `_model` and the parity pieces to `_parity`.
from kerasnorm.export._model import as_graph_model as as_graph_model
from kerasnorm.export._model import check_model as check_model
from kerasnorm.export._parity import ROUNDING_FACTOR as ROUNDING_FACTOR
from kerasnorm.export._parity import Verification as Verification
from kerasnorm.export._parity import sample_inputs as sample_inputs


class ExportVerificationError(RuntimeError):
    """An exported artifact does not reproduce the Keras model closely enough."""


class ExportConversionError(ValueError):
    """The converter could not express the model (TFLite builtins, say)."""


@dataclasses.dataclass
class ExportResult:
    """What `to_saved_model` / `to_tflite` wrote, and how it verified.

    For a model that computes in half precision, `rebuilt_from` is its dtype
    policy (`"mixed_float16"`, ...): the artifact was exported from a copy
    rebuilt in float32 (float16 with `export_dtype="float16"`), which
    `verification` compares it with; `original_verification` compares it with
    the original, within a tolerance for its compute dtype. Both None else.
    """

    path: str
    kind: str
    quantize: str | None
    size_bytes: int
    fold_report: FoldReport | None
    verification: Verification | None
    rebuilt_from: str | None = None
    original_verification: Verification | None = None
    # The recurrent layers a full-integer export unrolled (`to_tflite`).
    unrolled: tuple[str, ...] = ()


def input_names(model):
    """Signature names of the model inputs: the Input names, made safe."""
    names = [safe_name(x.name) or f"input_{i}" for i, x in enumerate(model.inputs)]
    return names if len(set(names)) == len(names) else _numbered("input", names)


def output_names(model):
    """Signature names of the outputs, in `keras.tree.flatten` order."""
    graph = functional_of(model)  # a Sequential's own `output` may be unset
    structure = graph.output if graph is not None else None
    if isinstance(structure, dict):
        names = [safe_name(k) for k in sorted(structure)]
    else:
        # Functional models (Keras 3 and tf_keras) name their output layers;
        # a Keras 3 Sequential has one output, its last layer's.
        layers = getattr(model, "output_names", None) or [model.layers[-1].name]
        names = [safe_name(name) for name in layers]
    return names if len(set(names)) == len(names) else _numbered("output", names)


def safe_name(name):
    """`name` as a signature or tensor name: letters, digits and `_` only."""
    return re.sub(r"[^A-Za-z0-9_]", "_", str(name)).strip("_")


def _numbered(prefix, names):
    return [f"{prefix}_{i}" for i in range(len(names))]


def as_input_list(model, data, argument):
    """Model inputs as a list of float arrays, shapes checked against the model.

    `data`: an array (one input), a list/tuple of arrays, a dict keyed by input
    name, or a `tf.data.Dataset` of such batches (or of (inputs, targets)).
    """
    names = [x.name for x in model.inputs]
    if hasattr(data, "as_numpy_iterator"):
        data = _from_dataset(data, names, argument)
    if isinstance(data, dict):
        data = _by_name(data, names, argument)
    arrays = [
        np.asarray(x) for x in (data if isinstance(data, (list, tuple)) else [data])
    ]
    if len(arrays) != len(model.inputs):
        raise ValueError(
            f"{argument} has {len(arrays)} input array(s) but the model has "
            f"{len(model.inputs)} input(s)."
        )
    for array, x in zip(arrays, model.inputs, strict=True):
        expected = tuple(x.shape)
        ok = array.ndim == len(expected) and all(
            e is None or e == a
            for e, a in zip(expected[1:], array.shape[1:], strict=True)
        )
        if not ok or len(array) == 0:
            raise ValueError(
                f"{argument} for input {x.name!r} should have shape "
                f"(N, {', '.join(str(d) for d in expected[1:])}) with N >= 1. "
                f"Received shape {array.shape}."
            )
    return [
        a.astype(keras.backend.standardize_dtype(x.dtype))
        for a, x in zip(arrays, model.inputs, strict=True)
    ]


def _by_name(data, names, argument):
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(
            f"{argument} is missing model input(s) {missing}. Received keys: "
            f"{sorted(data)}"
        )
    return [data[n] for n in names]


def _from_dataset(dataset, names, argument, limit=10_000):
    """The first `limit` samples of a dataset of input batches, concatenated.

    An element is a batch of inputs as `as_input_list` takes them (an array, a
    tuple/list, a dict by input name), or `(inputs, targets[, weights])` as
    `fit()` takes them; the first is told apart by its structure.
    """
    batches = []
    count = 0
    for element in dataset.as_numpy_iterator():
        element = _batch_inputs(element, names, argument)
        batches.append(element)
        count += len(element[0])
        if count >= limit:
            break
    if not batches:
        raise ValueError("The dataset given as data is empty.")
    return [np.concatenate(parts) for parts in zip(*batches, strict=True)]


def _batch_inputs(element, names, argument):
    if isinstance(element, dict):
        return _by_name(element, names, argument)
    if not isinstance(element, (list, tuple)):
        return [element]
    nested = isinstance(element[0], (list, tuple, dict))
    if nested or (len(names) == 1 and len(element) in (2, 3)):
        return _batch_inputs(element[0], names, argument)  # (inputs, targets)
    return list(element)


def check_inputs(model, data, samples, argument="verify_inputs"):
    """The inputs every check of one export runs on, as a list in
    `model.inputs` order: `data` checked, or `samples` invented ones."""
    if data is None:
        return sample_inputs(model, samples)
    return as_input_list(model, data, argument)


def as_model_inputs(model, arrays):
    """A list in `model.inputs` order in the structure the model takes."""
    if len(arrays) == 1:
        return arrays[0]
    structure = (functional_of(model) or model).input
    return keras.tree.pack_sequence_as(structure, list(arrays))


def refuse_existing(path, overwrite):
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(
            f"{path!r} already exists. Pass overwrite=True (--force on the "
            "command line) to replace it."
        )


@contextlib.contextmanager
def staged(path, *, directory, suffix=""):
    """A temporary path beside `path`, moved into place if the block succeeds.

    The temporary name starts with a dot: TF Serving only loads numeric
    version directories, so it never picks up a half-written export. On error
    the temporary is removed, and so are the directories above `path` that
    were created for it; whatever was at `path` is left untouched.
    The temporary is created with the modes `open` and `mkdir` give (0o666 and
    0o777 less the umask), not `tempfile`'s owner-only 0o600/0o700, because
    it becomes the artifact: a server running as another user must read it.
    """
    parent = os.path.dirname(os.path.abspath(path))
    created = _missing_directories(parent)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(path)
    tmp = _create_beside(parent, f".{base}.tmp-", suffix, directory)
    try:
        yield tmp
        if directory and os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.replace(path, os.path.join(old, base))
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)
        _remove_empty(created)
        raise


def _missing_directories(directory):
    """`directory` and those of its ancestors that do not exist, deepest first."""
    missing = []
    while not os.path.lexists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    return missing


def _remove_empty(directories):
    """Remove `directories` (deepest first) while they are empty: another
    process may have written into one meanwhile, and that one is kept."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            return


def _create_beside(parent, prefix, suffix, directory):
    """Create a new, uniquely named file or directory in `parent`."""
    while True:
        tmp = os.path.join(parent, f"{prefix}{secrets.token_hex(4)}{suffix}")
        try:
            if directory:
                os.mkdir(tmp)
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return tmp


def path_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
    )
