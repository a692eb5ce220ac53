"""Stage 3: the one verifier. An artifact runs once on the verification
inputs; its outputs are compared with the model it was exported from and,
for a model rebuilt from half precision, with the user's original too.
`verify` is the same check for an artifact on disk."""

from __future__ import annotations

import os

import keras
import numpy as np

from kerasnorm._core import check_choice
from kerasnorm.export.inputs.data import RANDOM_SAMPLES
from kerasnorm.export.inputs.data import InputSpec
from kerasnorm.export.inputs.data import inputs_to_check
from kerasnorm.export.inputs.second_shape import second_inputs
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import check_model
from kerasnorm.export.naming.names import input_names
from kerasnorm.export.naming.names import output_names
from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.numerics.metrics import StreamedErrors
from kerasnorm.export.numerics.metrics import flat_outputs
from kerasnorm.export.options.modes import MODES
from kerasnorm.export.options.modes import QUANTIZE_MODES
from kerasnorm.export.verify.fresh import check_in_fresh_process
from kerasnorm.export.verify.run import run_stream
from kerasnorm.export.verify.run import run_whole
from kerasnorm.export.verify.verification import Verification
from kerasnorm.export.verify.verification import float64_recheck

# Where `metrics.errors` puts the error each criterion bounds.
CRITERION_INDEX = {"max": 1, "rms": 2}


def verify(
    model: keras.Model,
    artifact: str | os.PathLike,
    verify_inputs=None,
    *,
    quantize: str | None = None,
    tolerance: float | None = None,
    samples: int = RANDOM_SAMPLES,
    latency_runs: int = 30,
    raise_on_failure: bool = True,
) -> Verification:
    """Run `artifact` and compare its outputs with `model`'s.

    An artifact with dynamic dimensions (its batch, a sequence length) runs
    at the inputs' shape and at a second one, each dynamic dimension at
    another size (half a length; batch 1, or 2 after a batch of 1); the
    errors are the worst of both (the max relative one over the largest
    output of both), `Verification.shapes` lists them.

    Args:
        model: the Keras model the artifact was exported from (unfolded is
            fine: folding must not change the function).
        artifact: a `.tflite` file (run with the LiteRT interpreter), a
            SavedModel directory, or a TF Serving base directory (the highest
            version is used; also loaded and called in another Python
            process, as a server loads it, which must give the same
            outputs); its `serving_default` signature is called, its
            inputs and outputs by the names `to_tflite` / `to_saved_model`
            give them (`litert.signature_names(model)`).
        verify_inputs: model inputs (an array, a list of arrays, a dict by
            input name or a `tf.data.Dataset`), batch first; all of them are
            run. Defaults to `samples` random samples (`sample_inputs` in
            `fold_batchnorm`'s docs says how they are made), and the
            `Verification` says `checked_on="random"`.
        quantize: the quantize mode the artifact was exported with; it
            chooses what is checked: max |artifact - keras| / max |keras|
            for the float modes (`None`, `"float16"`), rms(artifact -
            keras) / rms(keras) for the quantized ones ([Export, int8
            parity](../guides/export.md#what-int8-parity-to-expect) says
            why). Defaults to `None`.
        tolerance: the largest allowed error of that kind. Defaults to
            `DEFAULT_TOLERANCE[quantize]`.
        samples: how many random samples when `verify_inputs` is None.
            Defaults to 32.
        latency_runs: calls timed for the median latency (batch of one TFLite
            call, or one sample for a SavedModel). Defaults to `30`.
        raise_on_failure: raise `ExportVerificationError` when the error
            exceeds `tolerance`. Defaults to `True`.

    Returns:
        A `Verification`: errors, op counts, size in bytes, latency per call.
    """
    check_choice(quantize, QUANTIZE_MODES, "quantize")
    check_model(model)
    inputs, checked_on = inputs_to_check(
        model, verify_inputs, samples=samples, layers=list(all_layers(model))
    )
    mode = MODES[quantize]
    spec = InputSpec.of(model)
    run = run_whole(
        artifact,
        inputs,
        (input_names(model), output_names(model)),
        latency_runs,
        second=lambda shapes: second_inputs(model, spec, inputs, shapes),
    )
    if run.fresh is not None:
        check_in_fresh_process(*run.fresh, label=os.fspath(artifact))
    return compare(
        model,
        spec,
        run,
        tolerance=mode.tolerance if tolerance is None else tolerance,
        criterion=mode.criterion,
        label=os.fspath(artifact),
        checked_on=checked_on,
        raise_on_failure=raise_on_failure,
    )


def verify_export(prepared, artifact, *, label):
    """`(verification, original_verification)` of the artifact that
    `prepared` was written to: against `prepared.reference` within
    `prepared.tolerance`, and for a rebuilt model against the user's
    original within `prepared.original_tolerance` (None when not rebuilt),
    both on the mode's criterion. Raises `ExportVerificationError` on the
    first that fails. A SavedModel's first call is also made in another
    process, as a server loads it (`fresh`), before the comparisons."""
    if prepared.streaming:
        run = run_stream(
            artifact,
            prepared.step,
            prepared.verify_inputs[0],
            prepared.output_names,
        )
    else:
        names = (list(prepared.inputs.names), prepared.output_names)
        # The artifact's shapes are `prepared.shapes`, which the second
        # shape's inputs were made for.
        second = prepared.second_inputs
        run = run_whole(
            artifact, prepared.verify_inputs, names, second=lambda _shapes: second
        )
    if run.fresh is not None:
        check_in_fresh_process(*run.fresh, label=os.fspath(artifact))
    models = [prepared.reference]
    if prepared.rebuild is not None:
        models.append(prepared.rebuild.original)
    check, *original = [
        _compare_prepared(prepared, model, run, label) for model in models
    ]
    return check, (original[0] if original else None)


def _compare_prepared(prepared, model, run, label):
    rebuilt = model is not prepared.reference
    return compare(
        model,
        prepared.inputs,
        run,
        tolerance=prepared.original_tolerance if rebuilt else prepared.tolerance,
        criterion=prepared.options.mode.criterion,
        label=label,
        checked_on=prepared.checked_on,
        streaming=prepared.streaming,
    )


# The most bytes of outputs (float32) one chunk of the comparison holds;
# its float64 differences take a few times that.
COMPARE_BYTES = 64 * 2**20


def _chunks(spec, flat, got):
    """`(inputs, got)` over chunks of the samples: the model's inputs in its
    structure and the artifact's outputs of those samples, each chunk's
    outputs at most `COMPARE_BYTES` (one sample at least); a single chunk
    when all of them fit."""
    per_sample = 4 * sum(int(np.prod(y.shape[1:])) for y in got)
    size = max(1, COMPARE_BYTES // max(per_sample, 1))
    for start in range(0, len(flat[0]), size):
        inputs = spec.pack([x[start : start + size] for x in flat])
        yield inputs, [y[start : start + size] for y in got]


def compare(
    model,
    spec,
    run,
    *,
    tolerance,
    criterion,
    label,
    checked_on,
    streaming=False,
    raise_on_failure=True,
):
    """The `Verification` of `run` (an artifact's outputs) against `model`
    on the same inputs, in the model's own input structure (`spec`);
    `checked_on` says where the inputs came from (`Verification`)."""
    # Each call shape's outputs are compared chunk by chunk as the model
    # computes them (`_chunks`): only figures are kept, never every
    # sample's reference outputs (a long sequence's logits are large).
    checks, pooled = [], StreamedErrors()
    for flat, got in [(run.inputs, run.outputs), *run.more]:
        errors = StreamedErrors()
        for inputs, part in _chunks(spec, flat, got):
            expected = flat_outputs(model, inputs)
            if len(got) != len(expected):
                raise ExportVerificationError(
                    f"{label} has {len(got)} outputs, the model {len(expected)}."
                )
            errors.add(part, expected)
            del expected
        checks.append((errors.errors(), flat, got))
        pooled.merge(errors)
    # The worst shape counts (a dynamic artifact runs at two); the max
    # relative error is over the largest |keras| of every shape.
    index = CRITERION_INDEX[criterion]
    worst = max(checks, key=lambda c: c[0][index])
    abs_err = max(c[0][0] for c in checks)
    max_rel = pooled.max_rel()
    rms_rel = max(c[0][2] for c in checks)
    result = Verification(
        artifact=label,
        kind=run.kind,
        size_bytes=run.size_bytes,
        ops=run.ops,
        max_abs_error=abs_err,
        max_rel_error=max_rel,
        rms_rel_error=rms_rel,
        tolerance=tolerance,
        criterion=criterion,
        latency_ms=run.latency_ms,
        samples=len(run.inputs[0]),
        checked_on=checked_on,
        delegation=run.delegation,
        shapes=run.shapes,
    )
    if criterion == "max" and result.checked_error > tolerance:
        _, flat, got = worst
        float64_recheck(result, model, _chunks(spec, flat, got))
    if raise_on_failure and not result.passed:
        if streaming:
            steps = run.inputs[0].shape[1]
            what = (
                f"Streaming parity check failed for {label}: the step run over "
                f"{steps} time steps from zero states differs from the "
                f"sequence model {model.name!r} by"
            )
        else:
            what = (
                f"Export parity check failed for {label}: against {model.name!r}, the"
            )
        raise ExportVerificationError(
            f"{what} {criterion} error {result.checked_error:.3e} of the "
            f"output scale, above the tolerance {tolerance:.3g}. {result}"
        )
    return result
