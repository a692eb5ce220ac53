"""Stage 1: the model prepared once, for every format and mode.

`prepare(model, options)` derives, in this order and nowhere else: the
float copy of a half-precision model and its compute dtype, the graph model
around a subclassed one, the one model check, its `ModelFacts` (layers,
rolled recurrent layers, whether one is recurrent, whether it is a QAT
model), the inputs (their names, structure and shapes), the file's input
shapes, the unrolled copy of a full-integer export, the fold's graph
rewrite, the step plan of a streaming export (once, on what is written),
the calibration data, the verification inputs (`inputs_to_check`), the
fold's self-check on those inputs, the calibration feed, the inputs of the
second check shape and the output signature names. The stages it calls are
handed these facts (the self-check its compute dtype and layers, the unroll
its rolled layers) rather than deriving them again. The writers (`tflite`,
`saved_model`) and the verifier (`verify`) read the `Prepared` it returns
(its `options` included) and derive none of it again.
"""

from __future__ import annotations

import dataclasses

import keras

from kerasnorm.export.fold.check import SelfCheck
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.fold.rewrite import fold_unchecked
from kerasnorm.export.fold.smooth import smooth
from kerasnorm.export.inputs.data import SAMPLE_DIMS
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.inputs.data import check_fits
from kerasnorm.export.inputs.data import inputs_to_check
from kerasnorm.export.inputs.second_shape import second_inputs
from kerasnorm.export.inputs.shapes import file_shapes
from kerasnorm.export.inputs.shapes import fixed_batch
from kerasnorm.export.model.facts import ModelFacts
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import as_graph_model
from kerasnorm.export.model.facts import check_model
from kerasnorm.export.model.facts import model_facts
from kerasnorm.export.naming.names import output_names
from kerasnorm.export.naming.names import step_output_names
from kerasnorm.export.numerics import precision
from kerasnorm.export.options.export_options import ExportOptions
from kerasnorm.export.prepare.unroll import unroll_rolled_loops
from kerasnorm.export.streaming.plan import DEFAULT_STEPS
from kerasnorm.export.streaming.plan import StepPlan
from kerasnorm.export.streaming.step import calibration_feed


@dataclasses.dataclass
class Prepared:
    """What every later stage of one export reads: its `options` and every
    fact derived from the model once.

    `reference` is what the artifact must compute (the user's model, or its
    float copy when `rebuild` is set, in which case `rebuild.original` is
    the user's model); `exported` is what is written (`reference` unrolled
    for a full-integer mode, then folded). `inputs` describes the inputs of
    all of them (`inputs.names` and `output_names` are the signature names;
    a streaming step's `output_names` are its `output_<i>`, its states
    aside).
    `verify_inputs` is flat, in `inputs.tensors` order (a streaming export:
    one array of sequences); `checked_on` says where they came from
    (`Verification.checked_on`). `calibration` is the converter's calibration
    data by signature name, or None. `step` is the streaming step of
    `exported`, or None. `facts` are `reference`'s layers, rolled recurrent
    layers, whether one is recurrent (so is `exported`, its copy) and
    whether it is a `quantize_aware` (tf_keras) model (`qat`).
    """

    options: ExportOptions
    reference: keras.Model
    exported: keras.Model
    rebuild: precision.Rebuild | None
    inputs: InputSpec
    output_names: list[str]
    verify_inputs: list
    facts: ModelFacts
    fold_report: FoldReport | None = None
    unrolled: tuple[str, ...] = ()
    calibration: dict | None = None
    # The norms `smooth` rescaled in place, and what puts them back.
    smoothed: tuple = ()
    restore: object = None
    step: StepPlan | None = None
    checked_on: str = "verify_inputs"
    # The artifact's input shapes, in `inputs.tensors` order, None where a
    # dimension is dynamic (`shapes.file_shapes`); a streaming step's frame
    # and states take the batch of the first.
    shapes: tuple = ()
    # The inputs of the second shape a dynamic whole-model file is checked at
    # (`second_shape.second_inputs`), flat; None without a dynamic dimension, and
    # for a streaming step.
    second_inputs: list | None = None

    @property
    def qat(self):
        return self.facts.qat

    @property
    def streaming(self):
        return self.step is not None

    @property
    def batch_size(self):
        """The artifact's fixed batch, or None when it is dynamic."""
        return self.shapes[0][0] if self.shapes else None

    @property
    def int8_writer(self):
        """Which writer makes the fast int8 file: "step" (int8 matmuls, the
        recurrent state and the cell's math in float: a streaming step, or a
        model with unrolled recurrent layers, whose state passes from copy
        to copy of the cell), "selective" (the norms' statistics in float),
        or None: the converter's own file (every other mode, `int8_io`, and
        a QAT model, whose trained ranges a recalibration would lose)."""
        if not self.options.fast_int8 or self.qat:
            return None
        return "step" if self.streaming or self.unrolled else "selective"

    @property
    def tolerance(self):
        """The tolerance against `reference`: the options' for a float32
        copy, plus the copy's compute tolerance for a float16 one (the fold
        rounds its kernels to float16)."""
        tolerance = self.options.tolerance
        if self.rebuild is None or self.options.rebuild_dtype == "float32":
            return tolerance
        return tolerance + precision.compute_tolerance(self.rebuild.copy)

    @property
    def original_tolerance(self):
        """The tolerance against a rebuilt model's original: the options'
        plus the original's compute tolerance (the two errors add); None
        when not rebuilt."""
        if self.rebuild is None:
            return None
        return self.options.tolerance + self.rebuild.tolerance


def prepare(model, options: ExportOptions) -> Prepared:
    """The `Prepared` export of `model` with `options` (checked already by
    `ExportOptions`).

    `export_dtype="float16"` keeps float16 compute where the format can: a
    SavedModel of a half-precision model is rebuilt under `mixed_float16`; a
    TFLite file keeps a float32 graph (TFLite's builtin kernels compute in
    float32) and stores float16 weights, which GPU delegates run in float16.
    """
    rebuild, reference, compute = _reference(model, options)
    facts = model_facts(reference)
    inputs = InputSpec.of(reference)
    shapes = file_shapes(
        inputs,
        batch_size=options.batch_size,
        input_signature=options.input_signature,
        fixed_batch=fixed_batch(
            calibrated=options.calibrated_file,
            recurrent=options.unrolls and facts.recurrent,
        ),
    )
    exported, unrolled = reference, ()
    if options.unrolls:
        exported, unrolled = unroll_rolled_loops(
            reference,
            options.mode,
            facts.rolled,
            max_steps=options.max_unroll_steps,
            shapes=shapes,
        )
    # A tf_keras (QAT) model has its BatchNorms folded by TFMOT already. The
    # fold's graph rewrite comes first, so that the step plan is built once,
    # on what is written, and refuses a model that cannot stream before its
    # data is read; the fold's self-check runs on the checked inputs below.
    folded = report = None
    if options.fold and not facts.qat:
        folded, report = fold_unchecked(exported, affines=options.folds_affines)
    step = None
    if options.streaming:
        step = StepPlan(exported if folded is None else folded)
    calibration, checked, checked_on = _data(reference, inputs, options, facts, shapes)
    if folded is not None:
        layers = facts.layers if exported is reference else None
        check = SelfCheck(
            exported,
            folded,
            report,
            None,
            compute_dtype=compute,
            layers=layers or tuple(all_layers(exported)),
        )
        check.run(inputs.pack(checked))
        exported = folded
    # A dynamic file is also checked at a second shape (a step at a second
    # batch size, which `verify.run` makes itself).
    if step is None:
        second = second_inputs(reference, inputs, checked, shapes)
        names = output_names(reference)
    else:
        second, names = None, step_output_names(len(step.per_step_outputs))
    # Last: the weights change in place, and `run_export` puts them back.
    smoothed, restore = _smoothed(exported, inputs, calibration, options)
    return Prepared(
        options=options,
        reference=reference,
        exported=exported,
        rebuild=rebuild,
        inputs=inputs,
        output_names=names,
        verify_inputs=checked,
        facts=facts,
        fold_report=report,
        unrolled=unrolled,
        calibration=_calibration_feed(options, step, calibration, shapes, inputs),
        smoothed=smoothed,
        restore=restore,
        step=step,
        checked_on=checked_on,
        shapes=shapes,
        second_inputs=second,
    )


def _reference(model, options):
    """`(rebuild, reference, compute dtype)`: the model the artifact must
    reproduce (a half-precision model's copy rebuilt under
    `options.rebuild_dtype`), as a graph model, checked."""
    layers = tuple(all_layers(model))
    rebuild = precision.rebuild(model, options.rebuild_dtype, layers=layers)
    reference, compute = (
        (model, precision.half_dtype(layers))
        if rebuild is None
        else (rebuild.copy, rebuild.compute_dtype)
    )
    verify_inputs = options.verify_inputs
    reference = as_graph_model(
        reference,
        options.representative_data if verify_inputs is None else verify_inputs,
        fold=options.fold,
        argument="representative_data" if verify_inputs is None else "verify_inputs",
    )
    check_model(reference)
    return rebuild, reference, compute


def _data(reference, inputs, options, facts, shapes):
    """`(calibration, checked, checked_on)`: the user's data read and
    refused where it does not fit the file's shapes, and the inputs every
    check runs on (`inputs_to_check`)."""
    calibration = None
    if options.representative_data is not None:
        calibration = inputs.read(options.representative_data, "representative_data")
        check_fits(calibration, shapes, inputs.names, "representative_data")
    checked, checked_on = inputs_to_check(
        reference,
        options.verify_inputs,
        calibration=calibration,
        batch_size=shapes[0][0],
        sizes=(DEFAULT_STEPS,) if options.streaming else SAMPLE_DIMS,
        shapes=shapes,
        layers=facts.layers,
    )
    check_fits(checked, shapes, inputs.names, checked_on)
    return calibration, checked, checked_on


def _calibration_feed(options, step, calibration, shapes, inputs):
    """The calibration data by signature name: a streaming step's frames
    and states, else the first `calibration_samples` (whole batches); None
    for a mode that does not calibrate."""
    samples, batch_size = options.calibration_samples, shapes[0][0] or 1
    if not options.mode.calibrates or calibration is None:
        return None
    if step is not None:
        return calibration_feed(step, calibration[0], samples, batch_size)
    n = min(len(calibration[0]), samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"representative_data has {len(calibration[0])} samples, fewer "
            f"than the batch size {batch_size}."
        )
    return {name: x[:n] for name, x in zip(inputs.names, calibration, strict=True)}


def _smoothed(exported, inputs, calibration, options):
    """`exported`'s norms smoothed in place on the first
    `calibration_samples` of `calibration` (`fold.smooth`): what was
    smoothed, and the function that puts the weights back (the export
    calls it when done); refused when no norm qualifies."""
    if options.smooth is None:
        return (), None
    data = inputs.pack([x[: options.calibration_samples] for x in calibration])
    strength = None if options.smooth is True else options.smooth
    smoothed, restore = smooth(exported, data, strength)
    if not smoothed:
        raise ValueError(
            f"smooth found no norm in model {exported.name!r} whose output only "
            "linear layers read (Dense, EinsumDense, a convolution; "
            'docs/guides/export.md, "Smoothing"), or none whose int8 product '
            "smoothing improves: nothing to smooth. Pass smooth=None."
        )
    return tuple(smoothed), restore
