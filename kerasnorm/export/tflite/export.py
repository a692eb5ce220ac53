"""`to_tflite`, the documented shortcut of `export(..., format="litert")`:
its arguments named (each declared once, `options.declared`), then the one
door."""

from __future__ import annotations

import os

import keras

from kerasnorm.export.options.modes import MAX_UNROLL_STEPS
from kerasnorm.export.pipeline.door import export
from kerasnorm.export.pipeline.result import ExportResult


def to_tflite(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    fold: bool = True,
    quantize: str | None = None,
    representative_data=None,
    int8_io: bool = False,
    calibration_samples: int | None = None,
    batch_size: int | None = None,
    input_signature=None,
    overwrite: bool = False,
    verify_inputs=None,
    tolerance: float | None = None,
    progress: bool = False,
    verbose: bool = False,
    streaming: bool = False,
    export_dtype: str = "float32",
    max_unroll_steps: int = MAX_UNROLL_STEPS,
    smooth: bool | float | None = None,
) -> ExportResult:
    """Write `model` as a `.tflite` file with builtin ops only, and verify it.

    Quantize modes: `None` (float32), `"float16"` (float16 weights),
    `"dynamic"` (int8 weights, float activations), `"int8"` (int8 weights
    and activations, calibrated on `representative_data`) and `"int16x8"`
    (full-integer: int16 activations, int8 weights, calibrated the same
    way). The quantized modes with calibration export a copy of the model
    with each rolled recurrent layer unrolled (`ExportResult.unrolled`
    names them).

    `"int8"` is the fast int8 file: the float32 file quantized with the few
    ops XNNPACK has no int8 kernel for kept in float inside it (each norm's
    statistics, `BATCH_MATMUL`, `SOFTMAX`, `GELU`, `MEAN`;
    `ExportResult.float_ops` lists them), so LiteRT's CPU delegate runs it
    as one partition, at about half to 0.7 of the float32 latency; a
    streaming step, and a model with an unrolled recurrent layer, also
    keeps the recurrent state and the cell's elementwise math in float
    (int8 would round the state at every step).
    Such a file is not integer-only: `int8_io=True` gives the converter's
    full-integer file (every op int8, int8 inputs and outputs), what a
    microcontroller or an integer-only accelerator needs. A
    `quantize_aware` model keeps the converter's int8 file too (the ranges
    it trained with are in it).

    A model quantized by Keras (`model.quantize("int8")` or `"int4"`) is
    written with Keras' own integers and scales, not re-quantized from a
    float copy, and checked against the quantized model with `"dynamic"`'s
    criterion and tolerance: int8 as a `"dynamic"` file (`quantize=None`
    or `"dynamic"`), int4 in LiteRT's block-wise int4 with dynamic int8
    activations (`quantize=None`; `ExportResult.quantize` is `"int4"`).
    Any other mode, `export_dtype="float16"`, `smooth` and Keras'
    `"float8"` are refused by name (`tflite.keras_weights` says why).

    The file is converted, written to a temporary file beside `path`, run
    with the LiteRT interpreter against the Keras model, and only then moved
    into place: a failed export leaves nothing behind and never touches an
    existing file. The file has one signature, `serving_default`, named as
    the SavedModel's: inputs by the model's Input names (a dict model's
    keys), outputs by the output layers' names, `input_<i>` / `output_<i>`
    where the model gives no usable name
    ([Signature names](../guides/export.md#signature-names) has the rule;
    `litert.signature_names(model)` gives them).

    Shapes: every dimension the model leaves undefined (the batch, a
    sequence length, an image size) stays dynamic in the file
    (`shape_signature` -1), as Keras' own exporter writes it; `batch_size`
    fixes the batch and `input_signature` any other such dimension. A
    fixed shape is faster on XNNPACK (the shape arithmetic of a dynamic one
    runs outside its partitions; docs/guides/export.md, "Shapes", has the
    figures). An `"int8"` / `"int16x8"` file, and the file of a model with
    a recurrent layer, keep batch 1 unless `batch_size` says otherwise (the
    converter lowers a loop only for a known batch); a recurrent model's
    length stays dynamic, except where a full-integer mode unrolls it (fix
    the length there). A dynamic file is checked at the
    `verify_inputs`' shape and at a second one, each dynamic dimension at
    another size (`Verification.shapes`).

    Args:
        model: a built Keras model, or the `tf_keras` model
            `quantize_aware` returns (not folded); a subclassed one (built
            by a call) with `fold=False`, its input shapes from
            `verify_inputs` (else `representative_data`) or the shapes it
            was built with.
        path: where to write; must end in `.tflite`.
        fold: fold BatchNorm into adjacent layers first (`fold_batchnorm`), and
            for a float32 `.tflite` file (`quantize=None`) the norms' gains and
            offsets into the linear layer after them where that is exact
            (`ExportResult.fold_report.affines`; docs/design.md §4). Defaults to
            `True`.
        quantize: `None`, `"float16"`, `"dynamic"`, `"int8"` or `"int16x8"`.
            Defaults to `None`.
        representative_data: calibration inputs for `"int8"` (an array, a list
            of arrays in `model.inputs` order, a dict by input name, or a
            `tf.data.Dataset` of any of these), batch first. Also used for
            verification when `verify_inputs` is None. Defaults to `None`.
        int8_io: with `"int8"`, write the full-integer file instead of the fast
            one: every op int8, the model's input and output tensors int8 too
            (no float boundary ops, no ops in float). Defaults to `False`.
        calibration_samples: at most this many samples of `representative_data`
            calibrate `"int8"` / `"int16x8"` (for a streaming step, time steps:
            frames with the states the float model reaches there, spread over
            the sequences). Defaults to `None`: 200, and 4000 for the fast
            streaming int8 step, whose int8 matmul inputs need a few thousand
            steps (docs/design.md, §11, has the figures).
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
        progress: print a line naming the mode and the calibration sample count
            during `"int8"` / `"int16x8"` calibration, and on a terminal a
            progress bar (not when piped). Defaults to `False`.
        verbose: let the TFLite converter's own log through to stderr. Defaults
            to `False`.
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
        max_unroll_steps: with `"int8"` / `"int16x8"`, the longest sequence a
            rolled recurrent layer is unrolled over; a longer one is refused
            (converter time and file size grow with each step). A streaming step
            unrolls nothing: with `streaming=True` any other value than the
            default is refused. Defaults to 64.
        smooth: with `"int8"` or `"dynamic"`, move outlier channels of each
            norm's output into the linear layers that read it, folded into the
            norm's gain (the same function in float; int8 then rounds the other
            channels finer): `True` searches the migration strength per norm on
            `representative_data`, a float in [0, 1] sets it. kerasnorm's norms
            and Keras' `LayerNormalization` read only by linear layers, and
            keras-hub's decoder blocks; `ExportResult.smoothed` lists the norms.
            Needs `representative_data`; refused with other modes and
            `streaming`. Defaults to `None` (off).

    Returns:
        An `ExportResult` with the fold report, the op types a fast int8
        file keeps in float (`float_ops`) and the `Verification` (with the
        file's XNNPACK partitions, `delegation`)
        (against the float32 copy of a mixed-precision model, and in
        `original_verification` against the model itself).

    Raises:
        ValueError: unbuilt model, bad path, unknown mode, missing or
            ill-shaped representative data, a bad `export_dtype`,
            `batch_size`, `input_signature`, `calibration_samples` or
            `max_unroll_steps`; a full-integer mode on a recurrent layer
            whose length is dynamic (the message says how to fix it).
        ExportConversionError: the converter failed, for instance on a layer
            TFLite builtins cannot express (named in the message).
        FileExistsError: `path` exists and `overwrite` is False.
        ExportVerificationError: the file does not reproduce the model.
    """

    return export(
        model,
        path,
        format="litert",
        fold=fold,
        quantize=quantize,
        representative_data=representative_data,
        int8_io=int8_io,
        calibration_samples=calibration_samples,
        batch_size=batch_size,
        input_signature=input_signature,
        overwrite=overwrite,
        verify_inputs=verify_inputs,
        tolerance=tolerance,
        progress=progress,
        verbose=verbose,
        streaming=streaming,
        export_dtype=export_dtype,
        max_unroll_steps=max_unroll_steps,
        smooth=smooth,
    )
