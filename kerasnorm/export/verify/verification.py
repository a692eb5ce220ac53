"""`Verification`: how one artifact compares with one Keras model."""

from __future__ import annotations

import dataclasses

import numpy as np

from kerasnorm.export.numerics.metrics import ROUNDING_FACTOR
from kerasnorm.export.numerics.metrics import StreamedErrors
from kerasnorm.export.numerics.metrics import flat_outputs
from kerasnorm.export.numerics.precision import float64_outputs
from kerasnorm.export.verify.delegation import Delegation

RANDOM_INPUTS_HINT = (
    "Checked on random inputs, which say little about real data: pass "
    "verify_inputs= (held-out inputs) for a check that does."
)


@dataclasses.dataclass
class Verification:
    """How an exported artifact compares with the Keras model it came from.

    Errors are over all samples, the worst output counting:
    `max_rel_error` is max |artifact - keras| divided by max |keras|, and
    `rms_rel_error` is the root mean square of the difference divided by
    that of the Keras output (the inverse square root of the signal to
    quantization noise ratio). `criterion` says which one `tolerance` bounds:
    `"max"` for float exports, `"rms"` for int8 (see `DEFAULT_TOLERANCE`).

    When the max error exceeds `tolerance`, the model is run again in
    float64 (rebuilt with the same weights): `float64_error` is the
    artifact's max relative error against that, `float32_rounding` the Keras
    model's own (float32 against float64). The artifact then passes if
    `float64_error` is within `tolerance` plus `ROUNDING_FACTOR` times
    `float32_rounding`: a deep network whose float32 rounding alone exceeds
    the tolerance is not refused, an artifact that computes something else
    is. Both are None when no re-check ran.

    `checked_on` says what the `samples` were: `"verify_inputs"` (the
    user's), `"representative_data"` (its first `VERIFY_SAMPLES`, when
    `to_tflite` was given no `verify_inputs`) or `"random"` (32 invented
    ones, `inputs_to_check`): a check on random inputs says little about real data,
    and an int8 file may be refused on noise that passes on real data.

    `delegation` says how a `.tflite` file runs on LiteRT's default CPU
    delegate, XNNPACK: its partitions and the ops left on the reference
    kernels, read from the interpreter the check ran (None for a
    SavedModel). One partition and nothing outside is the fast case.

    `shapes` are the input shapes of the calls: one entry for a fixed-shape
    artifact, two for a dynamic one (its `verify_inputs`' shape and a second
    one with each dynamic dimension at another size); the errors are the
    worst over them, `max_rel_error` the largest |artifact - keras| of any
    over the largest |keras| of any (so it stays `max_abs_error` over the
    output scale).
    """

    artifact: str
    kind: str  # "saved_model" or "tflite"
    size_bytes: int
    ops: dict[str, int]
    max_abs_error: float
    max_rel_error: float
    rms_rel_error: float
    tolerance: float
    criterion: str  # "max" or "rms"
    latency_ms: float
    samples: int
    checked_on: str = "verify_inputs"
    float64_error: float | None = None
    float32_rounding: float | None = None
    delegation: Delegation | None = None
    # The input shapes the artifact ran at: one tuple of the inputs' shapes
    # per call shape (a dynamic artifact: its inputs' and a second one).
    shapes: tuple = ()

    @property
    def checked_error(self) -> float:
        """The error `tolerance` bounds: `max_rel_error` or `rms_rel_error`."""
        return self.max_rel_error if self.criterion == "max" else self.rms_rel_error

    @property
    def passed(self) -> bool:
        """Whether the artifact is within `tolerance` of the model.

        Either `checked_error` is within it, or (for the `max` criterion)
        the artifact is within it plus `ROUNDING_FACTOR` times Keras' own
        float32 rounding of the float64 model: float32 rounding, not a
        wrong export.
        """
        if self.checked_error <= self.tolerance:
            return True
        if self.float64_error is None or self.criterion != "max":
            return False
        bound = self.tolerance + ROUNDING_FACTOR * self.float32_rounding
        return bool(self.float64_error <= bound)

    @property
    def random_inputs(self) -> bool:
        """Whether the check ran on invented inputs (`checked_on`)."""
        return self.checked_on == "random"

    def __str__(self) -> str:
        status = "ok" if self.passed else "FAILED"
        source = "random inputs" if self.random_inputs else f"of {self.checked_on}"
        return (
            f"{self.artifact}: {self.kind}, {self.size_bytes / 1024:.1f} KiB, "
            f"{sum(self.ops.values())} ops, {self.samples} samples "
            f"({source}), max abs "
            f"error {self.max_abs_error:.2e}, max rel error "
            f"{self.max_rel_error:.2e}, rms rel error {self.rms_rel_error:.2e} "
            f"({self.criterion} tolerance {self.tolerance:.3g}, {status}), "
            f"{self.latency_ms:.3f} ms/call"
            + (
                f", at shapes {_shapes_text(self.shapes)}"
                if len(self.shapes) > 1
                else ""
            )
            + (
                ""
                if self.float64_error is None
                else f"; against float64 Keras {self.float64_error:.2e}, Keras' "
                f"own float32 rounding {self.float32_rounding:.2e}"
            )
            + ("" if self.delegation is None else f"; XNNPACK: {self.delegation}")
            + (f". {RANDOM_INPUTS_HINT}" if self.random_inputs else "")
        )


def _shapes_text(shapes):
    return " and ".join(
        "/".join(str(tuple(int(d) for d in s)) for s in call) for call in shapes
    )


def float64_recheck(result, model, chunks):
    """Fill in `float64_error` and `float32_rounding` of `result` (see
    `Verification`) from `model` run on `chunks`, `(inputs, got)` pairs (the
    inputs in the structure the model takes, the artifact's outputs on
    them) compared one at a time; leave them None when the model cannot be
    rebuilt in float64."""
    artifact, keras_own = StreamedErrors(), StreamedErrors()
    for inputs, got in chunks:
        try:
            exact = float64_outputs(model, inputs)
        except Exception:
            return
        exact = [np.asarray(y, "float64") for y in exact]
        artifact.add(got, exact)
        keras_own.add(flat_outputs(model, inputs), exact)
    result.float64_error = artifact.max_rel()
    result.float32_rounding = keras_own.max_rel()
