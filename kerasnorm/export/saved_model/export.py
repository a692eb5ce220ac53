"""`to_saved_model`, the SavedModel format's public door: its arguments
named and checked (`ExportOptions.saved_model`), the version directory in TF
Serving's layout, then the one export run with the SavedModel writer."""

from __future__ import annotations

import os

import keras

from kerasnorm._core import check_positive_int
from kerasnorm.export.options.export_options import ExportOptions
from kerasnorm.export.options.modes import DEFAULT_TOLERANCE
from kerasnorm.export.pipeline.result import ExportResult
from kerasnorm.export.pipeline.run import run_export
from kerasnorm.export.saved_model.write import write_saved_model
from kerasnorm.export.verify.fresh import loader


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
    batch_size: int | None = None,
    input_signature=None,
) -> ExportResult:
    """Write `model` as a SavedModel at `<path>/<version>/`, and verify it.

    The SavedModel has one `serving_default` signature whose inputs are named
    after the model's `Input`s (a dict model's keys) and whose outputs are
    named after the output layers (or the keys of a dict of outputs),
    `input_<i>` / `output_<i>` where the model gives no usable name, as the
    `.tflite` file's
    ([Signature names](../guides/export.md#signature-names) has the rule).
    Every dimension the model leaves undefined (the batch, a sequence
    length) stays dynamic unless `batch_size` or `input_signature` fixes
    it, and the check runs the SavedModel at the inputs' shapes and at a
    second one ([Shapes](../guides/export.md#shapes-dynamic-and-fixed-dimensions)).
    `path` is the model's base directory as TF Serving expects it
    (`model_base_path`); each export is a numeric version directory in it.

    The SavedModel is written to a hidden temporary directory beside the
    version directory (TF Serving ignores non-numeric names), loaded back with
    `tf.saved_model.load` and compared with the Keras model, loaded and
    called again in another Python process that imports TensorFlow only
    (as a server loads it; one such process serves a Python session's
    exports, `verify.fresh`), which must give the same outputs, and only
    then renamed into place. A layer calling `tf.py_function` /
    `tf.numpy_function`, which no other process can run, is refused by
    name.

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
            parity checks, whole or streaming (an array, a list in
            `model.inputs` order, a dict by input name or dict key, or a
            `tf.data.Dataset`; see `model_inputs`). Defaults to
            32 random samples (`fold_batchnorm` says how
            they are made), which say little about real data: the result's
            `verification.checked_on` is then `"random"`.
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
        batch_size: fix the signature's batch. Defaults to `None`: dynamic.
        input_signature: fix dimensions the model leaves undefined, as
            `to_tflite` takes it. Defaults to `None`: they stay dynamic.

    Returns:
        An `ExportResult`; `path` is the version directory written. For a
        mixed-precision model `verification` compares the SavedModel with
        the copy (`tolerance`; with `export_dtype="float16"` plus the
        compute tolerance, the fold rounding its kernels to float16) and
        `original_verification` with the model itself (`tolerance` plus
        its compute dtype's).

    Raises:
        ValueError: unbuilt model, bad `path`, `version`, `batch_size` or
            `input_signature`.
        FileExistsError: the version directory exists and `overwrite` is False.
        ExportConversionError: a layer calls back into this Python process
            (`tf.py_function`), which no server can.
        ExportVerificationError: the SavedModel does not reproduce the
            model, or fails in a fresh process.
    """

    options = ExportOptions.saved_model(
        fold=fold,
        overwrite=overwrite,
        verify_inputs=verify_inputs,
        tolerance=tolerance,
        streaming=streaming,
        export_dtype=export_dtype,
        batch_size=batch_size,
        input_signature=input_signature,
    )
    base = os.fspath(path)
    if os.path.isfile(base) or base.endswith((".keras", ".tflite", ".h5")):
        raise ValueError(
            "path should be a directory (TF Serving's model base path). "
            f"Received: path={base!r}"
        )
    target = os.path.join(base, str(_version(base, version)))
    # The process that loads it as a server would, started now if it is
    # not running: its TensorFlow import overlaps with the export's work.
    loader()
    return run_export(model, options, target, _write)


def _write(prepared, directory):
    write_saved_model(prepared, directory)
    return ()


def _version(base, version):
    if version is None:
        existing = [
            int(d)
            for d in (os.listdir(base) if os.path.isdir(base) else [])
            if d.isdigit()
        ]
        return max(existing, default=0) + 1
    return check_positive_int(version, "version")
