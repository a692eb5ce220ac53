"""`to_saved_model`, the documented shortcut of `export(...,
format="tf_saved_model")`: its arguments named (each declared once,
`options.declared`), then the one door, which places the version directory
in TF Serving's layout."""

from __future__ import annotations

import os

import keras

from kerasnorm.export.pipeline.door import export
from kerasnorm.export.pipeline.result import ExportResult


def to_saved_model(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    fold: bool = True,
    version: int | None = None,
    overwrite: bool = False,
    verify_inputs=None,
    tolerance: float | None = None,
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
        fold: fold BatchNorm into adjacent layers first (`fold_batchnorm`), and
            for a float32 `.tflite` file (`quantize=None`) the norms' gains and
            offsets into the linear layer after them where that is exact
            (`ExportResult.fold_report.affines`; docs/design.md §4). Defaults to
            `True`.
        version: the SavedModel's positive integer version. Defaults to `None`:
            one more than the highest version already in `path` (1 in an empty
            directory).
        overwrite: replace an existing file or version directory. Defaults to
            `False`.
        verify_inputs: inputs for every check, all of them used, in any form
            `model_inputs` takes: the fold's self-check and the parity checks
            (against the model, and against the original of a rebuilt one),
            whole or streaming; best a held-out set. Defaults to the first
            `VERIFY_SAMPLES` (256) samples of `representative_data`, else 32
            random samples (`fold_batchnorm` says how they are made), which say
            little about real data; `verification.checked_on` says which.
        tolerance: the parity tolerance (see `DEFAULT_TOLERANCE` for what is
            compared in each mode). Defaults to `DEFAULT_TOLERANCE[quantize]`
            (`1e-4` of the output scale for a float artifact).
        streaming: write one time step of a sequence model instead: inputs `x`
            (one frame) and the recurrent states `state_<layer>_<i>`, outputs
            `output_<i>` and the new states under the same names, verified by
            running it over the sequences from zero states (int8 calibrates on
            the states the float model reaches). Layers that mix time steps are
            refused. `litert.StreamingRunner` runs the `.tflite` step.
            `verify_inputs` are then sequences `(N, time, features)`; a token
            model (integer ids `(batch, time)` into an `Embedding`) streams one
            id per call, `x` of shape `(batch,)`, its mask (`mask_zero=True`)
            followed as Keras follows it. Defaults to `False`.
        export_dtype: `"float32"` or `"float16"`. A model under a
            `mixed_float16` / `mixed_bfloat16` policy is exported from a float32
            copy of its graph with the same weights (the result's
            `rebuilt_from`); `"float16"` keeps float16 compute in a SavedModel
            (a copy rebuilt under `mixed_float16`, for GPU serving) and stores
            float16 weights in a `.tflite` file (`quantize="float16"`, which GPU
            delegates run in float16; other quantize modes are refused with it).
            Defaults to `"float32"`.
        batch_size: fix the artifact's batch. Defaults to `None`: dynamic (a
            `.tflite` file: 1 for a model with a recurrent layer, and for
            `"int8"` / `"int16x8"`).
        input_signature: fix dimensions the model leaves undefined, in the forms
            Keras' `model.export(..., input_signature=...)` takes:
            `keras.InputSpec` / `tf.TensorSpec` per input, as a list in
            `model.inputs` order (or Keras' one-element list of the input
            structure), a dict by input name, or one spec for a one-input model;
            a plain shape tuple works too, e.g. `{"tokens": (None, 128)}`.
            `None` in a spec keeps that dimension dynamic; the dtype and the
            dimensions the model defines are the model's. Not with `streaming`.
            Defaults to `None`.

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

    return export(
        model,
        path,
        format="tf_saved_model",
        fold=fold,
        version=version,
        overwrite=overwrite,
        verify_inputs=verify_inputs,
        tolerance=tolerance,
        streaming=streaming,
        export_dtype=export_dtype,
        batch_size=batch_size,
        input_signature=input_signature,
    )
