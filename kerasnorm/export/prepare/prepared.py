"""Stage 1: the model prepared once, for every format and mode.

`prepare` derives, in this order and nowhere else: the float copy of a
half-precision model, the graph model around a subclassed one, the one
model check, the step plan of a streaming export, the unrolled copy of a
full-integer one, the inputs (their names, structure and shapes), the
calibration data, the verification inputs (the user's, else invented), the
fold and its self-check on those inputs, and the calibration feed. The
writers (`tflite`, `saved_model`) and the verifier (`verify`) read the
`Prepared` it returns and derive none of it again.
"""

from __future__ import annotations

import dataclasses

import keras

from kerasnorm._core import check_positive_int
from kerasnorm.export._common import precision
from kerasnorm.export._common.inputs import SAMPLE_DIMS
from kerasnorm.export._common.inputs import InputSpec
from kerasnorm.export._common.inputs import sample_inputs
from kerasnorm.export._common.model import as_graph_model
from kerasnorm.export._common.model import check_model
from kerasnorm.export._common.model import is_tf_keras_model
from kerasnorm.export._common.modes import FULL_INTEGER_MODES
from kerasnorm.export._common.modes import MAX_UNROLL_STEPS
from kerasnorm.export._common.modes import RANDOM_SAMPLES
from kerasnorm.export._common.modes import VERIFY_SAMPLES
from kerasnorm.export._common.modes import check_export_dtype
from kerasnorm.export._common.names import output_names
from kerasnorm.export._common.shapes import check_fits
from kerasnorm.export._common.shapes import file_shapes
from kerasnorm.export._common.shapes import model_file_shapes
from kerasnorm.export.fold.check import SelfCheck
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.fold.rewrite import fold_unchecked
from kerasnorm.export.prepare.unroll import refuse_rolled_loops
from kerasnorm.export.prepare.unroll import unroll_rolled_loops
from kerasnorm.export.streaming.plan import DEFAULT_STEPS
from kerasnorm.export.streaming.plan import StepPlan
from kerasnorm.export.streaming.step import calibration_feed


@dataclasses.dataclass
class Prepared:
    """What every later stage of one export reads.

    `reference` is what the artifact must compute (the user's model, or its
    float copy when `rebuild` is set, in which case `rebuild.original` is
    the user's model); `exported` is what is written (`reference` unrolled
    for a full-integer mode, then folded). `inputs` describes the inputs of
    all of them; `input_names` / `output_names` are the signature names.
    `verify_inputs` is flat, in `inputs.tensors` order (a streaming export:
    one array of sequences); `checked_on` says where they came from
    (`Verification.checked_on`). `calibration` is the converter's calibration
    data by signature name, or None. `step` is the streaming step of
    `exported`, or None.
    """

    reference: keras.Model
    exported: keras.Model
    rebuild: precision.Rebuild | None
    inputs: InputSpec
    input_names: list[str]
    output_names: list[str]
    verify_inputs: list
    fold_report: FoldReport | None = None
    unrolled: tuple[str, ...] = ()
    calibration: dict | None = None
    step: StepPlan | None = None
    checked_on: str = "verify_inputs"
    # The artifact's input shapes, in `inputs.tensors` order, None where a
    # dimension is dynamic (`shapes.file_shapes`); a streaming step's frame
    # and states take the batch of the first.
    shapes: tuple = ()

    @property
    def batch_size(self):
        """The artifact's fixed batch, or None when it is dynamic."""
        return self.shapes[0][0] if self.shapes else None

    @property
    def streaming(self):
        return self.step is not None


def prepare(
    model,
    *,
    target_kind,
    fold,
    streaming=False,
    quantize=None,
    export_dtype="float32",
    verify_inputs=None,
    representative_data=None,
    calibration_samples=200,
    batch_size=None,
    input_signature=None,
    max_unroll_steps=MAX_UNROLL_STEPS,
):
    """The `Prepared` export of `model` to `target_kind` ("tflite",
    "saved_model"); every argument as `to_tflite` takes it.

    `export_dtype="float16"` keeps float16 compute where the format can: a
    SavedModel of a half-precision model is rebuilt under `mixed_float16`; a
    TFLite file keeps a float32 graph (TFLite's builtin kernels compute in
    float32) and stores float16 weights, which GPU delegates run in float16.
    """
    check_export_dtype(export_dtype)
    max_unroll_steps = check_positive_int(max_unroll_steps, "max_unroll_steps")
    if streaming and max_unroll_steps != MAX_UNROLL_STEPS:
        raise ValueError(
            "max_unroll_steps bounds the recurrent layers a whole-sequence "
            "full-integer export unrolls; a streaming step runs one time step "
            "per call and unrolls nothing. Received: max_unroll_steps="
            f"{max_unroll_steps} with streaming=True; leave max_unroll_steps "
            "at its default."
        )
    float16 = export_dtype == "float16" and target_kind == "saved_model"
    rebuild = precision.rebuild(model, "float16" if float16 else "float32")
    reference = model if rebuild is None else rebuild.copy
    reference = as_graph_model(
        reference,
        representative_data if verify_inputs is None else verify_inputs,
        fold=fold,
    )
    check_model(reference)
    step = StepPlan(reference) if streaming else None  # refuses before any work
    inputs = InputSpec.of(reference)
    if streaming and input_signature is not None:
        raise ValueError(
            "input_signature fixes the dimensions of a whole-sequence "
            "artifact's inputs; a streaming step takes one frame, its "
            "features the model's. Leave input_signature out with "
            "streaming=True (batch_size fixes how many streams a call runs)."
        )
    shapes = file_shapes(inputs, batch_size=batch_size, input_signature=input_signature)
    exported, unrolled = reference, ()
    if target_kind == "tflite" and not streaming:
        exported, unrolled = unroll_rolled_loops(
            reference, quantize=quantize, max_steps=max_unroll_steps, shapes=shapes
        )
        refuse_rolled_loops(exported, quantize)
        shapes = model_file_shapes(
            exported, inputs, batch_size=batch_size, input_signature=shapes
        )

    calibration = None
    if representative_data is not None:
        calibration = inputs.flatten(representative_data, "representative_data")
        check_fits(calibration, shapes, inputs.names, "representative_data")
    checked, checked_on = _verification_inputs(
        reference, inputs, verify_inputs, calibration, shapes, streaming
    )
    check_fits(checked, shapes, inputs.names, checked_on)

    report = None
    # A tf_keras (QAT) model has its BatchNorms folded by TFMOT already.
    if fold and not is_tf_keras_model(exported):
        folded, report = fold_unchecked(exported)
        SelfCheck(exported, folded, report, None).run(inputs.pack(checked))
        exported = folded
    if streaming:
        step = StepPlan(exported)

    feed = None
    if quantize in FULL_INTEGER_MODES and calibration is not None:
        feed = _calibration_feed(
            step, inputs, calibration, calibration_samples, shapes[0][0] or 1
        )
    return Prepared(
        reference=reference,
        exported=exported,
        rebuild=rebuild,
        inputs=inputs,
        input_names=list(inputs.names),
        output_names=output_names(reference),
        verify_inputs=checked,
        fold_report=report,
        unrolled=unrolled,
        calibration=feed,
        step=step,
        checked_on=checked_on,
        shapes=shapes,
    )


def _verification_inputs(model, inputs, data, calibration, shapes, streaming):
    """What every check runs on, flat, and where it came from: the user's
    `verify_inputs`, else the first `VERIFY_SAMPLES` calibration samples,
    else `RANDOM_SAMPLES` random samples (sequences of `DEFAULT_STEPS` steps
    for a streaming export; an undefined dimension the artifact fixes at
    its size)."""
    if data is not None:
        return inputs.flatten(data, "verify_inputs"), "verify_inputs"
    batch = shapes[0][0] or 1
    if calibration is not None:
        head = [x[: max(batch, VERIFY_SAMPLES)] for x in calibration]
        return head, "representative_data"
    sizes = (DEFAULT_STEPS,) if streaming else SAMPLE_DIMS
    samples = max(batch, RANDOM_SAMPLES)
    return sample_inputs(model, samples, sizes=sizes, shapes=shapes), "random"


def _calibration_feed(step, inputs, calibration, samples, batch_size):
    """The calibration data by signature name: a streaming step's frames
    and states, else the first `samples` (whole batches) of `calibration`."""
    if step is not None:
        return calibration_feed(step, calibration[0], samples, batch_size)
    n = min(len(calibration[0]), samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"representative_data has {len(calibration[0])} samples, fewer than "
            f"the batch size {batch_size}."
        )
    return {name: x[:n] for name, x in zip(inputs.names, calibration, strict=True)}
