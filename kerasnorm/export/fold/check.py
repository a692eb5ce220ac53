"""The fold's self-check: the original and the folded model run side by
side on the same inputs, with a float64 re-check that tells float rounding
from a wrong fold (docs/design.md §4), and the diverging layers named."""

from __future__ import annotations

import collections

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export.fold.report import FoldVerificationError
from kerasnorm.export.fold.rewrite import fold_unchecked
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import input_structure
from kerasnorm.export.numerics import metrics as _parity
from kerasnorm.export.numerics import precision


class SelfCheck:
    """Run the original and the folded model side by side; raise on mismatch.

    Every run leaves the models' non-trainable state as it found it: the
    folded model shares the unchanged layers with the original, so a
    stateful RNN's state advanced by the original's run would otherwise be
    the folded run's initial state (a false mismatch), and the user's model
    would come back with a different state.
    """

    def __init__(self, original, folded, report, tolerance, *, compute_dtype, layers):
        """`compute_dtype` is `precision.compute_dtype(original)` and `layers`
        every layer of `original` (`all_layers`): facts the caller derived
        once (`prepare`, `fold_batchnorm`)."""
        self.original = original
        self.folded = folded
        self.report = report
        self.given_tolerance = tolerance
        self.compute_dtype = compute_dtype
        self.tolerance = (
            _parity.FOLD_TOLERANCE[compute_dtype or "float32"]
            if tolerance is None
            else tolerance
        )
        # The folded model's recurrent layers are the original's own objects
        # (`rewrite` copies only the layers a BN folds into).
        variables = {}
        for v in [
            *original.non_trainable_variables,
            *folded.non_trainable_variables,
            *_rnn_states(layers),
        ]:
            variables.setdefault(id(v), v)
        self._state = list(variables.values())

    def _run(self, model, inputs):
        saved = [np.array(v) for v in self._state]
        try:
            return _parity.flat_outputs(model, inputs)
        finally:
            for v, value in zip(self._state, saved, strict=True):
                v.assign(value)

    def error(self, inputs):
        """max over outputs of |folded - original| / max |original|."""
        try:
            want = self._run(self.original, inputs)
        except Exception as err:
            raise ValueError(
                f"fold_batchnorm could not run model {self.original.name!r} on "
                "its check inputs to verify the fold; pass verify_inputs= with "
                f"valid model inputs. The model raised: {err}"
            ) from err
        got = self._run(self.folded, inputs)
        errors = [_parity.relative_error(a, b) for a, b in zip(want, got, strict=True)]
        return max(errors, default=0.0)

    def run(self, inputs):
        """Check on `inputs` (in the structure the models take); raise
        `FoldVerificationError` on a mismatch."""
        error = self.error(inputs)
        self.report.check_error = error
        self.report.check_shapes = [
            tuple(np.shape(x)) for x in keras.tree.flatten(inputs)
        ]
        if error <= self.tolerance and self.compute_dtype is None:
            return
        try:
            twin = self._float64_twin(inputs)
        except Exception as err:
            if error <= self.tolerance:
                return  # half precision, within its own tolerance
            raise FoldVerificationError(
                f"{self._differs(error)} {self._diverging(inputs)} (The float64 "
                f"re-check that tells float rounding from a wrong fold could "
                f"not run: {type(err).__name__}: {err})"
            ) from err
        twin_check, inputs64 = twin
        error64 = twin_check.error(inputs64)
        self.report.check_error_float64 = error64
        if error64 > twin_check.tolerance:
            raise FoldVerificationError(
                f"{self._differs(error)} {twin_check._diverging(inputs64)} In "
                f"float64 it differs by {error64:.3e} (tolerance "
                f"{twin_check.tolerance:.1e}): a wrong fold, not float rounding."
            )

    def _differs(self, error):
        return (
            f"The folded model of {self.original.name!r} differs from the "
            f"original by {error:.3e} of the output scale (tolerance "
            f"{self.tolerance:.1e})."
        )

    def _float64_twin(self, inputs):
        """The same check on both models rebuilt in float64, and its inputs.

        The original is rebuilt from its config under float64 with its
        weights (float32 and float16 values are exact in float64) and folded
        again by the same code; the folded model's float32 weights would
        carry the rounding the re-check is there to rule out.
        """
        original = precision.float64_twin(self.original)
        layers = list(all_layers(original))
        folded, report = fold_unchecked(original, affines=bool(self.report.affines))
        if (report.folded, report.affines) != (self.report.folded, self.report.affines):
            raise RuntimeError("the float64 model folds differently")
        tolerance = (
            _parity.FLOAT64_TOLERANCE
            if self.given_tolerance is None
            else self.given_tolerance
        )
        inputs64 = keras.tree.map_structure(precision.as_float64, inputs)
        twin = SelfCheck(
            original, folded, report, tolerance, compute_dtype=None, layers=layers
        )
        return twin, inputs64

    def _diverging(self, inputs):
        """Which top-level layers' outputs diverge first, as a sentence."""
        original = _tensors_by_call(self.original)
        for fold in self.report.folded:
            bn_output = (fold.batchnorm, 0, 0)
            if fold.position == "after" and bn_output in original:
                # The folded layer's output stands for the BN's output.
                original[(fold.into, 0, 0)] = original.pop(bn_output)
        # A norm whose affine folded, and the layers after it up to the
        # linear ones, compute without it: their outputs differ by design.
        changed = {
            name for fold in self.report.affines for name in (fold.norm, *fold.through)
        }
        folded = _tensors_by_call(self.folded)
        keys = [key for key in folded if key in original and key[0] not in changed]
        want, got = (
            self._run(
                keras.Model(input_structure(model), [tensors[k] for k in keys]), inputs
            )
            for model, tensors in ((self.original, original), (self.folded, folded))
        )
        bad = [
            f"{key[0]!r} ({error:.1e})"
            for key, a, b in zip(keys, want, got, strict=True)
            if (error := _parity.relative_error(a, b)) > self.tolerance
        ]
        if not bad:
            return "No single layer output differs beyond the tolerance."
        return f"Outputs first diverge at layer(s) {', '.join(bad[:5])}."


def _rnn_states(layers):
    """The state variables of the stateful RNN layers among `layers`, which
    Keras keeps out of `non_trainable_variables`."""
    return [
        v
        for layer in layers
        if getattr(layer, "stateful", False) and getattr(layer, "states", None)
        for v in keras.tree.flatten(layer.states)
        if isinstance(v, keras.Variable)
    ]


def _tensors_by_call(model):
    """{(layer name, call index, output index): tensor}, inputs first."""
    tensors = {}
    seen = collections.Counter()
    for node in graph_nodes(functional_of(model)):
        name = node.operation.name
        for i, y in enumerate(node.outputs):
            tensors[(name, seen[name], i)] = y
        seen[name] += 1
    return tensors
