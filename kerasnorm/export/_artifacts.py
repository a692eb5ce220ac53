"""What every exporter shares: model and data checks, atomic writes, results."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile

import keras
import numpy as np

from kerasnorm.export._folding import FoldReport
from kerasnorm.export._folding import check_model as check_model


class ExportVerificationError(RuntimeError):
    """An exported artifact does not reproduce the Keras model closely enough."""


@dataclasses.dataclass
class Verification:
    """How an exported artifact compares with the Keras model it came from.

    Errors are over all outputs and samples; `max_rel_error` is the max
    absolute error divided by the output scale (max |Keras output|).
    """

    artifact: str
    kind: str  # "saved_model" or "tflite"
    size_bytes: int
    ops: dict[str, int]
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    latency_ms: float
    samples: int

    @property
    def passed(self) -> bool:
        return bool(self.max_rel_error <= self.tolerance)

    def __str__(self) -> str:
        status = "ok" if self.passed else "FAILED"
        return (
            f"{self.artifact}: {self.kind}, {self.size_bytes / 1024:.1f} KiB, "
            f"{sum(self.ops.values())} ops, max abs error {self.max_abs_error:.2e}, "
            f"max rel error {self.max_rel_error:.2e} (tolerance "
            f"{self.tolerance:.3g}, {status}), {self.latency_ms:.3f} ms/call"
        )


@dataclasses.dataclass
class ExportResult:
    """What `to_saved_model` / `to_tflite` wrote, and how it verified."""

    path: str
    kind: str
    quantize: str | None
    size_bytes: int
    fold_report: FoldReport | None
    verification: Verification | None


def input_names(model):
    """Signature names of the model inputs: the Input names, made safe."""
    names = [_safe(x.name) or f"input_{i}" for i, x in enumerate(model.inputs)]
    return names if len(set(names)) == len(names) else _numbered("input", names)


def output_names(model):
    """Signature names of the outputs, in `keras.tree.flatten` order."""
    structure = model._outputs_struct if hasattr(model, "_outputs_struct") else None
    if isinstance(structure, dict):
        names = [_safe(k) for k in sorted(structure)]
    else:
        names = [_safe(x._keras_history.operation.name) for x in model.outputs]
    return names if len(set(names)) == len(names) else _numbered("output", names)


def _safe(name):
    return re.sub(r"[^A-Za-z0-9_]", "_", str(name)).strip("_")


def _numbered(prefix, names):
    return [f"{prefix}_{i}" for i in range(len(names))]


def as_input_list(model, data, argument):
    """Model inputs as a list of float arrays, shapes checked against the model.

    `data`: an array (one input), a list/tuple of arrays, a dict keyed by input
    name, or a `tf.data.Dataset` of such batches (or of (inputs, targets)).
    """
    if hasattr(data, "as_numpy_iterator"):
        data = _from_dataset(data, len(model.inputs))
    if isinstance(data, dict):
        names = [x.name for x in model.inputs]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(
                f"{argument} is missing model input(s) {missing}. Received keys: "
                f"{sorted(data)}"
            )
        data = [data[n] for n in names]
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


def _from_dataset(dataset, n_inputs, limit=10_000):
    batches = []
    count = 0
    for element in dataset.as_numpy_iterator():
        if isinstance(element, tuple) and len(element) in (2, 3) and n_inputs == 1:
            element = element[0]  # (inputs, targets[, weights]) as for fit()
        element = list(element) if isinstance(element, (list, tuple)) else [element]
        batches.append(element)
        count += len(element[0])
        if count >= limit:
            break
    if not batches:
        raise ValueError("The dataset given as data is empty.")
    return [np.concatenate(parts) for parts in zip(*batches, strict=True)]


def sample_inputs(model, n, seed=0):
    """Standard-normal inputs for verification when none are given."""
    rng = np.random.default_rng(seed)
    arrays = []
    for x in model.inputs:
        if any(d is None for d in x.shape[1:]):
            raise ValueError(
                f"Model input {x.name!r} has an undefined dimension "
                f"{tuple(x.shape)}: pass `inputs=` to verify the export."
            )
        arrays.append(rng.standard_normal((n, *x.shape[1:])).astype("float32"))
    return arrays


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
    the temporary is removed and whatever was at `path` is left untouched.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(path)
    if directory:
        tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.tmp-", suffix=suffix, dir=parent)
        os.close(fd)
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
        raise


def path_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
    )
