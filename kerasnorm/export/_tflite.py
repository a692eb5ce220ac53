"""`to_tflite`: a verified `.tflite` file, float or quantized."""

from __future__ import annotations

import os
import re

import keras
import numpy as np

from kerasnorm._core import check_choice
from kerasnorm.export import _artifacts
from kerasnorm.export import _litert
from kerasnorm.export._artifacts import ExportResult
from kerasnorm.export._folding import fold_batchnorm
from kerasnorm.export._verify import DEFAULT_TOLERANCE
from kerasnorm.export._verify import verify

QUANTIZE_MODES = (None, "float16", "dynamic", "int8")


def to_tflite(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    fold: bool = True,
    quantize: str | None = None,
    representative_data=None,
    int8_io: bool = False,
    calibration_samples: int = 200,
    batch_size: int = 1,
    overwrite: bool = False,
    verify_inputs=None,
    tolerance: float | None = None,
    progress: bool = False,
) -> ExportResult:
    """Write `model` as a `.tflite` file with builtin ops only, and verify it.

    Quantize modes: `None` (float32), `"float16"` (float16 weights),
    `"dynamic"` (int8 weights, float activations) and `"int8"` (full-integer:
    int8 weights and activations, calibrated on `representative_data`).

    The file is converted, written to a temporary file beside `path`, run
    with the LiteRT interpreter against the Keras model, and only then moved
    into place: a failed export leaves nothing behind and never touches an
    existing file.

    Args:
        model: a built Keras model with fixed non-batch input dimensions.
        path: where to write; must end in `.tflite`.
        fold: fold BatchNorm into adjacent layers first (`fold_batchnorm`).
            Defaults to `True`.
        quantize: `None`, `"float16"`, `"dynamic"` or `"int8"`. Defaults to
            `None`.
        representative_data: calibration inputs for `"int8"` (an array, a list
            of arrays, a dict by input name or a `tf.data.Dataset`), batch
            first. Also used for verification when `verify_inputs` is None.
            Defaults to `None`.
        int8_io: with `"int8"`, make the model's input and output tensors
            int8 too (no float boundary ops). Defaults to `False`.
        calibration_samples: at most this many samples of
            `representative_data` calibrate `"int8"`. Defaults to `200`.
        batch_size: the file's fixed batch size. Defaults to `1`.
        overwrite: replace an existing file. Defaults to `False`.
        verify_inputs: inputs for the parity check. Defaults to
            `representative_data`, else random normal samples.
        tolerance: largest allowed max |tflite - keras| / max |keras|.
            Defaults to 1e-4 for float32, 1e-2 float16, 5e-2 dynamic, 0.15 int8.
        progress: show a progress bar during int8 calibration. Defaults to
            `False`.

    Returns:
        An `ExportResult` with the fold report and the `Verification`.

    Raises:
        ValueError: unbuilt model, bad path, unknown mode, missing or
            ill-shaped representative data, a layer TFLite builtins cannot
            express (named).
        FileExistsError: `path` exists and `overwrite` is False.
        ExportVerificationError: the file does not reproduce the model.
    """
    _artifacts.check_model(model)
    path = os.fspath(path)
    if not path.endswith(".tflite"):
        raise ValueError(f"path should end in '.tflite'. Received: path={path!r}")
    check_choice(quantize, QUANTIZE_MODES, "quantize")
    if quantize == "int8" and representative_data is None:
        raise ValueError(
            'quantize="int8" calibrates activation ranges and needs '
            "representative_data (a few hundred typical inputs). Received: "
            "representative_data=None"
        )
    if int8_io and quantize != "int8":
        raise ValueError(
            f'int8_io=True needs quantize="int8". Received: quantize={quantize!r}'
        )
    if os.path.isdir(path):
        raise ValueError(f"path is a directory: {path!r}. Give a .tflite file path.")
    _artifacts.refuse_existing(path, overwrite)
    calibration = None
    if representative_data is not None:
        calibration = _artifacts.as_input_list(
            model, representative_data, "representative_data"
        )

    report = None
    exported = model
    if fold:
        exported, report = fold_batchnorm(model, return_report=True)
    content = _convert(
        exported,
        quantize,
        calibration,
        int8_io,
        calibration_samples,
        batch_size,
        progress,
    )
    if tolerance is None:
        tolerance = DEFAULT_TOLERANCE[quantize]
    if verify_inputs is None and calibration is not None:
        verify_inputs = [x[: max(batch_size, 32)] for x in calibration]
    with _artifacts.staged(path, directory=False, suffix=".tflite") as tmp:
        with open(tmp, "wb") as f:
            f.write(content)
        check = verify(model, tmp, verify_inputs, tolerance=tolerance)
    check.artifact = path
    return ExportResult(
        path=path,
        kind="tflite",
        quantize=quantize,
        size_bytes=len(content),
        fold_report=report,
        verification=check,
    )


def _convert(model, quantize, calibration, int8_io, samples, batch_size, progress):
    import tensorflow as tf

    kwargs = {}
    if quantize is not None:
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        kwargs["supported_types"] = [tf.float16]
    if quantize == "int8":
        kwargs["representative_dataset"] = _representative(
            calibration, samples, batch_size, progress
        )
        kwargs["full_integer"] = True
        if int8_io:
            kwargs["inference_input_type"] = tf.int8
            kwargs["inference_output_type"] = tf.int8
    try:
        return _litert.convert(model, batch_size=batch_size, **kwargs)
    except Exception as err:
        raise _explain(model, batch_size, err) from err


def _representative(calibration, samples, batch_size, progress):
    n = min(len(calibration[0]), samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"representative_data has {len(calibration[0])} samples, fewer than "
            f"the batch size {batch_size}."
        )

    def generate():
        bar = keras.utils.Progbar(n, unit_name="sample") if progress else None
        for i in range(0, n, batch_size):
            yield [x[i : i + batch_size].astype(np.float32) for x in calibration]
            if bar is not None:
                bar.update(i + batch_size)

    return generate


def _explain(model, batch_size, err):
    """A conversion error that names the layer(s) TFLite cannot express."""
    message = str(err)
    match = re.search(r"(?:TF Select ops|Flex ops): ([\w, ]+)", message)
    if not match:
        return ValueError(f"TFLite conversion failed: {message[:2000]}")
    op_types = {op.strip() for op in match.group(1).split(",")}
    layers = _layers_using(model, batch_size, op_types)
    where = (
        "layer(s) " + ", ".join(repr(name) for name in layers)
        if layers
        else "the model"
    )
    return ValueError(
        f"Cannot export {where} to TFLite with builtin ops only: they use "
        f"{', '.join(sorted(op_types))}, which needs the Flex (select TF ops) "
        "runtime. Replace the layer or export it as a SavedModel."
    )


def _layers_using(model, batch_size, op_types):
    names = {layer.name for layer in _all_layers(model)}
    found = []
    graph = _litert.concrete_function(model, batch_size).graph
    for op in graph.get_operations():
        if op.type not in op_types:
            continue
        for scope in reversed(op.name.split("/")[:-1]):
            base = re.sub(r"_\d+$", "", scope)
            name = scope if scope in names else base if base in names else None
            if name and name not in found:
                found.append(name)
                break
    return found


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)
