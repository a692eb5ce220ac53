"""`to_tflite`: a verified `.tflite` file, float or quantized."""

from __future__ import annotations

import dataclasses
import os
import re

import keras
import numpy as np
import tensorflow as tf

from kerasnorm._core import check_choice
from kerasnorm.export import _artifacts
from kerasnorm.export import _mixed_precision
from kerasnorm.export import _model
from kerasnorm.export import _unroll
from kerasnorm.export import _verify
from kerasnorm.export import litert
from kerasnorm.export._artifacts import ExportConversionError
from kerasnorm.export._artifacts import ExportResult
from kerasnorm.export._folding import fold_batchnorm
from kerasnorm.export._model import all_layers
from kerasnorm.export._model import is_tf_keras_model
from kerasnorm.export._parity import CRITERION
from kerasnorm.export._parity import DEFAULT_TOLERANCE

QUANTIZE_MODES = (None, "float16", "dynamic", "int8", "int16x8")
# Samples of representative_data the parity check runs when verify_inputs is
# None: enough that the check sees the tails of the int8 error, not only
# its typical size.
VERIFY_SAMPLES = 256


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
    verbose: bool = False,
    streaming: bool = False,
    export_dtype: str = "float32",
    max_unroll_steps: int = _unroll.MAX_UNROLL_STEPS,
) -> ExportResult:
    """Write `model` as a `.tflite` file with builtin ops only, and verify it.

    Quantize modes: `None` (float32), `"float16"` (float16 weights),
    `"dynamic"` (int8 weights, float activations), `"int8"` (full-integer:
    int8 weights and activations, calibrated on `representative_data`) and
    `"int16x8"` (full-integer: int16 activations, int8 weights, calibrated
    the same way). The full-integer modes export a copy of the model with
    each rolled recurrent layer unrolled (`ExportResult.unrolled` names them).

    The file is converted, written to a temporary file beside `path`, run
    with the LiteRT interpreter against the Keras model, and only then moved
    into place: a failed export leaves nothing behind and never touches an
    existing file. The file has one signature, `serving_default`, with inputs
    `input_0, ...` in `model.inputs` order and outputs `output_0, ...` in
    `keras.tree.flatten` order of the model's outputs.

    Args:
        model: a built Keras model with fixed non-batch input dimensions,
            or the `tf_keras` model `quantize_aware` returns (not folded); a
            subclassed one (built by a call) with `fold=False`, its input
            shapes from `verify_inputs` (else `representative_data`) or the
            shapes it was built with.
        path: where to write; must end in `.tflite`.
        fold: fold BatchNorm into adjacent layers first (`fold_batchnorm`).
            Defaults to `True`.
        quantize: `None`, `"float16"`, `"dynamic"`, `"int8"` or `"int16x8"`.
            Defaults to `None`.
        representative_data: calibration inputs for `"int8"` (an array, a list
            of arrays in `model.inputs` order, a dict by input name, or a
            `tf.data.Dataset` of any of these), batch first. Also used for
            verification when `verify_inputs` is None. Defaults to `None`.
        int8_io: with `"int8"`, make the model's input and output tensors
            int8 too (no float boundary ops). Defaults to `False`.
        calibration_samples: at most this many samples of
            `representative_data` calibrate `"int8"`. Defaults to `200`.
        batch_size: the file's fixed batch size. Defaults to `1`.
        overwrite: replace an existing file. Defaults to `False`.
        verify_inputs: inputs for every check, all of them used: the fold's
            self-check and the parity check; best a held-out set. Defaults
            to the first `VERIFY_SAMPLES` (256) samples of
            `representative_data`, else 8 random samples (`fold_batchnorm`
            says how they are made).
        tolerance: the parity tolerance (see `DEFAULT_TOLERANCE` for what is
            compared in each mode). Defaults to `DEFAULT_TOLERANCE[quantize]`.
        progress: print the calibration sample count and a progress bar
            during int8 calibration. Defaults to `False`.
        verbose: let the TFLite converter's own log through to stderr.
            Defaults to `False`.
        streaming: write one time step of a sequence model instead: inputs
            `x` (one frame) and the recurrent states `state_<layer>_<i>`,
            outputs `output_<i>` and the new states under the same names,
            verified by running it over the sequences from zero states (int8
            calibrates on the states the float model reaches). Layers that
            mix time steps are refused. `litert.StreamingRunner` runs it.
            Defaults to `False`.
        export_dtype: `"float32"` or `"float16"`. A model under a
            `mixed_float16` / `mixed_bfloat16` policy is exported from a
            float32 copy of its graph with the same weights (the result's
            `rebuilt_from`); `"float16"` also stores float16 weights
            (`quantize="float16"`, which GPU delegates run in float16;
            other quantize modes are refused with it). Defaults to
            `"float32"`.
        max_unroll_steps: with `"int8"` / `"int16x8"`, the longest sequence
            a rolled recurrent layer is unrolled over; a longer one is
            refused (converter time and file size grow with each step).
            Defaults to `MAX_UNROLL_STEPS` (64).

    Returns:
        An `ExportResult` with the fold report and the `Verification`
        (against the float32 copy of a mixed-precision model, and in
        `original_verification` against the model itself).

    Raises:
        ValueError: unbuilt model, bad path, unknown mode, missing or
            ill-shaped representative data, a bad `export_dtype`.
        ExportConversionError: the converter failed, for instance on a layer
            TFLite builtins cannot express (named in the message).
        FileExistsError: `path` exists and `overwrite` is False.
        ExportVerificationError: the file does not reproduce the model.
    """
    quantize = _mixed_precision.tflite_quantize(export_dtype, quantize)
    rebuilt = _mixed_precision.prepare(model, export_dtype, "tflite")
    if rebuilt is not None:
        model = rebuilt.copy
    if streaming:
        from kerasnorm.export import _streaming

        result = _streaming.to_tflite(
            model,
            path,
            fold=fold,
            quantize=quantize,
            representative_data=representative_data,
            int8_io=int8_io,
            calibration_samples=calibration_samples,
            batch_size=batch_size,
            overwrite=overwrite,
            verify_inputs=verify_inputs,
            tolerance=tolerance,
            progress=progress,
            verbose=verbose,
        )
        fields = _mixed_precision.result_fields(rebuilt, None)
        return dataclasses.replace(result, **fields)
    model = _model.as_graph_model(
        model,
        representative_data if verify_inputs is None else verify_inputs,
        fold=fold,
    )
    path = _check_arguments(model, path, quantize, representative_data, int8_io)
    _artifacts.refuse_existing(path, overwrite)
    rolled = model
    model, unrolled = _unroll.unroll_rolled_loops(
        model, quantize=quantize, max_steps=max_unroll_steps
    )
    _refuse_rolled_loops(model, quantize)
    calibration = None
    if representative_data is not None:
        calibration = _artifacts.as_input_list(
            model, representative_data, "representative_data"
        )
    if verify_inputs is None and calibration is not None:
        verify_inputs = [x[: max(batch_size, VERIFY_SAMPLES)] for x in calibration]
    # One set of inputs for every check: the fold's self-check and the
    # parity check run on the same samples.
    inputs = _artifacts.check_inputs(model, verify_inputs, 8)

    report = None
    exported = model
    # A tf_keras (QAT) model has its BatchNorms folded by TFMOT already.
    if fold and not is_tf_keras_model(model):
        exported, report = fold_batchnorm(
            model,
            return_report=True,
            verify_inputs=_artifacts.as_model_inputs(model, inputs),
        )
    options = _ConvertOptions(
        quantize, int8_io, calibration_samples, batch_size, progress, verbose
    )
    content = _convert(exported, calibration, options)
    _unroll.refuse_zero_scales(content, quantize)
    with _artifacts.staged(path, directory=False, suffix=".tflite") as tmp:
        with open(tmp, "wb") as f:
            f.write(content)
        if tolerance is None:
            tolerance = DEFAULT_TOLERANCE[quantize]
        criterion = CRITERION[quantize]
        check = _verify.check(
            rolled, tmp, inputs, tolerance=tolerance, criterion=criterion, label=path
        )
        original = None
        if rebuilt is not None:
            original = _mixed_precision.verify_original(
                rebuilt,
                tmp,
                inputs,
                tolerance=tolerance,
                criterion=criterion,
                label=path,
            )
    return ExportResult(
        path=path,
        kind="tflite",
        quantize=quantize,
        size_bytes=len(content),
        fold_report=report,
        verification=check,
        **_mixed_precision.result_fields(rebuilt, original),
        unrolled=unrolled,
    )


def _check_arguments(model, path, quantize, representative_data, int8_io):
    _model.check_model(model)
    path = os.fspath(path)
    if not path.endswith(".tflite"):
        raise ValueError(f"path should end in '.tflite'. Received: path={path!r}")
    check_choice(quantize, QUANTIZE_MODES, "quantize")
    if quantize in _unroll.FULL_INTEGER_MODES and representative_data is None:
        raise ValueError(
            f"quantize={quantize!r} calibrates activation ranges and needs "
            "representative_data (a few hundred typical inputs). Received: "
            "representative_data=None"
        )
    if int8_io and quantize != "int8":
        raise ValueError(
            f'int8_io=True needs quantize="int8". Received: quantize={quantize!r}'
        )
    if os.path.isdir(path):
        raise ValueError(f"path is a directory: {path!r}. Give a .tflite file path.")
    return path


def _refuse_rolled_loops(model, quantize):
    """TFLite's full-integer calibration kills the Python process (a
    segmentation fault, tensorflow 2.21) on a recurrent layer that runs as a
    loop, Keras' own LSTM included: refuse before converting what
    `_unroll.unroll_rolled_loops` left rolled (a tf_keras QAT model)."""
    if quantize not in _unroll.FULL_INTEGER_MODES:
        return
    loops = list(dict.fromkeys(layer.name for layer in recurrent_loops(model)))
    if loops:
        raise ValueError(
            f"quantize={quantize!r} cannot convert a recurrent layer that runs as a "
            "loop: TFLite's int8 calibration crashes the process on it. "
            f"Received: layer(s) {', '.join(map(repr, loops))}. Export it "
            'with quantize="dynamic" or "float16", or build the layer with '
            "unroll=True for a fixed sequence length."
        )


def recurrent_loops(layer):
    """Every recurrent layer with a rolled time loop inside `layer`: models,
    Bidirectional and other wrappers (TFMOT's too) are searched."""
    if getattr(layer, "unroll", True) is False and hasattr(layer, "cell"):
        yield layer
        return
    children = list(getattr(layer, "layers", None) or [])
    for name in ("layer", "forward_layer", "backward_layer"):
        child = getattr(layer, name, None)
        if hasattr(child, "get_config"):  # a Keras 3 or tf_keras layer
            children.append(child)
    for child in children:
        yield from recurrent_loops(child)


@dataclasses.dataclass(frozen=True)
class _ConvertOptions:
    quantize: str | None
    int8_io: bool
    calibration_samples: int
    batch_size: int
    progress: bool
    verbose: bool


def _convert(model, calibration, options):
    kwargs = {}
    if options.quantize is not None:
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if options.quantize == "float16":
        kwargs["supported_types"] = [tf.float16]
    if options.quantize in _unroll.FULL_INTEGER_MODES:
        kwargs["representative_dataset"] = _representative(calibration, options)
        kwargs["full_integer"] = True
    if options.quantize == "int16x8":
        kwargs["int16_activations"] = True
        kwargs["function"] = _unroll.square_as_mul(
            litert.concrete_function(model, options.batch_size)
        )
    if options.quantize == "int8":
        if options.int8_io:
            kwargs["inference_input_type"] = tf.int8
            kwargs["inference_output_type"] = tf.int8
    try:
        return litert.convert(
            model, batch_size=options.batch_size, verbose=options.verbose, **kwargs
        )
    except Exception as err:
        raise _explain(model, options.batch_size, err) from err


def _representative(calibration, options):
    """The converter's calibration feed: dicts by signature input name."""
    step = options.batch_size
    n = min(len(calibration[0]), options.calibration_samples) // step * step
    if n == 0:
        raise ValueError(
            f"representative_data has {len(calibration[0])} samples, fewer than "
            f"the batch size {step}."
        )

    def generate():
        bar = None
        if options.progress:
            print(f"Calibrating int8 on {n} samples:")
            bar = keras.utils.Progbar(n, unit_name="sample")
        for i in range(0, n, step):
            yield {
                litert.input_name(k): x[i : i + step].astype(np.float32)
                for k, x in enumerate(calibration)
            }
            if bar is not None:
                bar.update(i + step)

    return generate


def _explain(model, batch_size, err):
    """A conversion error that names the layer(s) TFLite cannot express."""
    # The runtime's error reporter joins its lines with no separator.
    message = re.sub(r"(?<=\S)(Node number \d+)", r" \1", str(err))
    match = re.search(r"(?:TF Select ops|Flex ops): ([\w, ]+)", message)
    if not match:
        return ExportConversionError(f"TFLite conversion failed: {message[:2000]}")
    op_types = {op.strip() for op in match.group(1).split(",")}
    layers = _layers_using(model, batch_size, op_types)
    where = (
        "layer(s) " + ", ".join(repr(name) for name in layers)
        if layers
        else "the model"
    )
    half = _mixed_precision.half_precision_layers(model)
    if half:
        where = "layer(s) " + ", ".join(repr(name) for name in half)
        half = [_mixed_precision.compute_dtype(model)]
        # Under a mixed policy the ops are float16 / bfloat16 ops, for which
        # TFLite has no builtin kernels; the op names alone read as if the
        # op itself were unsupported.
        return ExportConversionError(
            f"Cannot export {where} to TFLite with builtin ops only: they "
            f"compute in {' / '.join(half)} (their dtype policy), and TFLite's "
            f"builtin {', '.join(sorted(op_types))} have no kernels for that "
            "type. Export it with export_dtype='float32' (the default), which "
            "rebuilds it in float32 with the same weights; quantize='float16' "
            "then stores half-size weights."
        )
    return ExportConversionError(
        f"Cannot export {where} to TFLite with builtin ops only: they use "
        f"{', '.join(sorted(op_types))}, which needs the Flex (select TF ops) "
        "runtime. Replace the layer or export it as a SavedModel."
    )


def _layers_using(model, batch_size, op_types):
    names = {layer.name for layer in all_layers(model)}
    found = []
    graph = litert.concrete_function(model, batch_size).graph
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
