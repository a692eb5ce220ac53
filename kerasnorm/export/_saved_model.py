"""`to_saved_model`: a verified SavedModel in TF Serving's version layout."""

from __future__ import annotations

import dataclasses
import os

import keras
import tensorflow as tf

from kerasnorm._compat import functional_of
from kerasnorm._core import check_positive_int
from kerasnorm.export import _artifacts
from kerasnorm.export import _mixed_precision
from kerasnorm.export import _model
from kerasnorm.export._artifacts import ExportResult
from kerasnorm.export._folding import fold_batchnorm
from kerasnorm.export._parity import DEFAULT_TOLERANCE
from kerasnorm.export._verify import check


def to_saved_model(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    fold: bool = True,
    version: int | None = None,
    overwrite: bool = False,
    verify_inputs=None,
    tolerance: float = DEFAULT_TOLERANCE[None],
    streaming: bool = False,
    export_dtype: str = "float32",
) -> ExportResult:
    """Write `model` as a SavedModel at `<path>/<version>/`, and verify it.

    The SavedModel has one `serving_default` signature whose inputs are named
    after the model's `Input`s and whose outputs are named after the output
    layers (or the keys of a dict of outputs), with a dynamic batch dimension.
    `path` is the model's base directory as TF Serving expects it
    (`model_base_path`); each export is a numeric version directory in it.

    The SavedModel is written to a hidden temporary directory beside the
    version directory (TF Serving ignores non-numeric names), loaded back with
    `tf.saved_model.load` and compared with the Keras model, and only then
    renamed into place.

    Args:
        model: a built Keras model; a subclassed one (built by a call) with
            `fold=False`, its signature from `verify_inputs` or the shapes it
            was built with.
        path: the base directory; created if needed.
        fold: fold BatchNorm into adjacent layers first (`fold_batchnorm`).
            Defaults to `True`.
        version: positive integer version. Defaults to `None`: one more than
            the highest version already in `path` (1 in an empty directory).
        overwrite: replace an existing version directory. Defaults to `False`.
        verify_inputs: inputs for every check: the fold's self-check and the
            parity check (an array, a list in `model.inputs` order, a dict by
            input name, or a `tf.data.Dataset`). Defaults to 8 random samples
            (`fold_batchnorm` says how they are made).
        tolerance: largest allowed max |savedmodel - keras| / max |keras|.
            Defaults to `1e-4`.
        streaming: write one time step of a sequence model instead, with the
            recurrent states as inputs and outputs (as `to_tflite(...,
            streaming=True)`, batch dimension dynamic). Defaults to `False`.
        export_dtype: `"float32"` or `"float16"`. A model under a
            `mixed_float16` / `mixed_bfloat16` policy is exported from a copy
            of its graph with the same weights, rebuilt under `float32`, or
            with `"float16"` under `mixed_float16` (float16 compute, for
            GPU serving); the result's `rebuilt_from` names the original
            policy. Defaults to `"float32"`.

    Returns:
        An `ExportResult`; `path` is the version directory written. For a
        mixed-precision model `verification` compares the SavedModel with
        the copy (`tolerance`; with `export_dtype="float16"` plus the
        compute tolerance, the fold rounding its kernels to float16) and
        `original_verification` with the model itself (`tolerance` plus
        its compute dtype's, `_mixed_precision.compute_tolerance`).

    Raises:
        ValueError: unbuilt model, bad `path` or `version`.
        FileExistsError: the version directory exists and `overwrite` is False.
        ExportVerificationError: the SavedModel does not reproduce the model.
    """

    rebuilt = _mixed_precision.prepare(model, export_dtype, "saved_model")
    if rebuilt is not None:
        model = rebuilt.copy
    model = _model.as_graph_model(model, verify_inputs, fold=fold)
    _model.check_model(model)
    base = os.fspath(path)
    if os.path.isfile(base) or base.endswith((".keras", ".tflite", ".h5")):
        raise ValueError(
            "path should be a directory (TF Serving's model base path). "
            f"Received: path={base!r}"
        )
    version = _version(base, version)
    target = os.path.join(base, str(version))
    if streaming:
        from kerasnorm.export import _streaming

        result = _streaming.to_saved_model(
            model,
            target,
            fold=fold,
            overwrite=overwrite,
            verify_inputs=verify_inputs,
            tolerance=tolerance,
        )
        fields = _mixed_precision.result_fields(rebuilt, None)
        return dataclasses.replace(result, **fields)
    _artifacts.refuse_existing(target, overwrite)

    # One set of inputs for every check: the fold's self-check and the
    # parity check run on the same samples.
    inputs = _artifacts.check_inputs(model, verify_inputs, 8)
    report = None
    exported = model
    if fold:
        exported, report = fold_batchnorm(
            model,
            return_report=True,
            verify_inputs=_artifacts.as_model_inputs(model, inputs),
        )
    in_names = _artifacts.input_names(model)
    out_names = _artifacts.output_names(model)
    specs = [
        tf.TensorSpec((None, *x.shape[1:]), x.dtype, name=name)
        for x, name in zip(exported.inputs, in_names, strict=True)
    ]
    # The inputs' dict or nested-list form (a Sequential's own `input` may be
    # unset; its graph's is not).
    structure = (functional_of(exported) or exported).input

    def serve(*args):
        if len(args) == 1:
            inputs = args[0]
        else:
            inputs = keras.tree.pack_sequence_as(structure, list(args))
        outputs = keras.tree.flatten(exported(inputs, training=False))
        return dict(zip(out_names, outputs, strict=True))

    archive = keras.export.ExportArchive()
    archive.track(exported)
    archive.add_endpoint("serving_default", serve, input_signature=specs)
    with _artifacts.staged(target, directory=True) as tmp:
        # Serving never differentiates: the norm layers' hand-written
        # gradients (tf.custom_gradient) stay out of the SavedModel.
        archive.write_out(
            tmp,
            verbose=False,
            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
        )
        result = check(
            model,
            tmp,
            inputs,
            tolerance=_mixed_precision.check_copy_tolerance(
                rebuilt, tolerance, export_dtype
            ),
            criterion="max",
            label=target,
        )
        original = None
        if rebuilt is not None:
            original = _mixed_precision.verify_original(
                rebuilt,
                tmp,
                inputs,
                tolerance=tolerance,
                criterion="max",
                label=target,
            )
    return ExportResult(
        path=target,
        kind="saved_model",
        quantize=None,
        size_bytes=result.size_bytes,
        fold_report=report,
        verification=result,
        **_mixed_precision.result_fields(rebuilt, original),
    )


def _version(base, version):
    if version is None:
        existing = [
            int(d)
            for d in (os.listdir(base) if os.path.isdir(base) else [])
            if d.isdigit()
        ]
        return max(existing, default=0) + 1
    return check_positive_int(version, "version")
