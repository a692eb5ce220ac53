"""The graph rewrite of a fold: rebuild each (nested) graph without the
folded BNs, copy the layers they fold into and write those copies' weights.

The folded model is a new graph. A layer that takes a BN's factors is a fresh
copy of a built-in Keras layer (its config round-trips exactly) whose weights
are written by role (`kernel`, `bias`, ...), never looked up by variable
name. Every other layer, and every nested model with nothing folded inside,
is the original object itself: see `_Pass.clone` for why.

A `WeightNorm` wrapper is replaced by the plain layer it computes, with the
kernel `g * v / ||v||` computed once (docs/design.md §6); BNs next to it then
fold into that plain layer like into any other.
"""

from __future__ import annotations

import collections
import functools

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export.fold import affine as _fold_affine
from kerasnorm.export.fold import fold_math as _fold_math
from kerasnorm.export.fold import plan as _fold_plan
from kerasnorm.export.fold.report import FoldReport
from kerasnorm.export.fold.weight_norm import unwrap_weight_norm
from kerasnorm.export.model.facts import all_layers
from kerasnorm.export.model.facts import is_graph_model
from kerasnorm.norms.weight_norm import WeightNorm


def fold_unchecked(model, *, affines=False):
    """The folded model and its `FoldReport`, before any self-check; with
    `affines`, the norms' affines too (`fold.affine`), after the BNs."""
    report = FoldReport()
    folded = model
    while True:
        step = _Pass(folded, _fold_plan.plan)
        folded = step.run()
        report.folded += step.report.folded
        report.kept = step.report.kept
        report.weight_norms += step.report.weight_norms
        # A BN next to another BN (BN -> BN -> Dense), or next to a WeightNorm
        # wrapper, becomes foldable once its neighbour is gone: fold again
        # until a pass changes nothing.
        if not step.report.changes() or not step.report.kept:
            break
    if affines and any(
        type(layer) in _fold_affine.NORMS for layer in all_layers(folded)
    ):
        # One pass: what an affine folds into is a linear layer, which
        # folding never removes, so a second pass would find nothing new.
        step = _Pass(folded, _fold_affine.plan)
        folded = step.run()
        report.affines += step.report.affines
    return folded, report


class _Pass:
    """One folding pass over a model and every model nested in it; `planner`
    plans one graph (`plan.plan` for BNs, `affine.plan` for norms' affines)."""

    def __init__(self, model, planner):
        self.model = model
        self.planner = planner
        self.calls = _call_counts(model)
        self.report = FoldReport()
        self.clones = {}  # id(original operation) -> its stand-in
        self.rewrites = []  # (original layer, its copy, fold steps)

    def run(self):
        folded = self.rebuild(self.model, prefix="")
        for layer, copy, steps in self.rewrites:
            _write_folded_weights(layer, copy, steps)
        return folded

    def rebuild(self, model, prefix):
        plan = self.planner(functional_of(model), self.calls, prefix)
        self.report.folded += plan.folded
        self.report.kept += plan.kept
        self.report.affines += plan.affines
        clone = functools.partial(self.clone, plan=plan, prefix=prefix)
        if isinstance(model, keras.Sequential):
            x = model.inputs[0]
            layers = [clone(op) for op in model.layers if id(op) not in plan.removed]
            first = keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name)
            return keras.Sequential([first, *layers], name=model.name)
        # An uncompiled twin over the same graph: clone_model would copy the
        # model's compile() settings, and fails on those that do not
        # serialize (a lambda metric), which folding has no use for.
        twin = keras.Model(model.input, model.output, name=model.name)
        return keras.models.clone_model(
            twin,
            clone_function=clone,
            call_function=functools.partial(_call_skipping, removed=plan.removed),
        )

    def clone(self, op, plan, prefix):
        """The stand-in for `op` in the folded graph.

        A layer that no BN folds into is reused, not copied: its whole state
        (weights set after build, `finalize_state()` products such as an
        adapted Normalization's, lookup tables, third-party layers whose
        config does not round-trip) carries over exactly, and the copy costs
        no memory. Folding never writes to a reused layer, so the original
        model stays unchanged; the price is that the two models share those
        variables, which `fold_batchnorm` documents.
        """
        if id(op) in self.clones:
            return self.clones[id(op)]
        if is_graph_model(op):
            changes_so_far = self.report.changes()
            new = self.rebuild(op, f"{prefix}{op.name}/")
            if self.report.changes() == changes_so_far:
                new = op  # nothing folded inside: keep the sub-model itself
        elif isinstance(op, WeightNorm):
            new = unwrap_weight_norm(op)
            self.report.weight_norms.append(prefix + op.name)
        elif id(op) in plan.steps:
            new = _copy_with_bias(op)
            self.rewrites.append((op, new, plan.steps[id(op)]))
        elif id(op) in plan.replaced:
            new = plan.replaced[id(op)]()
        else:
            new = op
        self.clones[id(op)] = new
        return new


def _call_skipping(op, *args, removed, **kwargs):
    """Call `op` as the original graph did, or pass a folded BN's input on."""
    if id(op) in removed:
        return args[0] if args else kwargs["inputs"]
    return op(*args, **kwargs)


def _call_counts(model, counts=None):
    """How many times each layer is called across the whole nested model."""
    counts = collections.Counter() if counts is None else counts
    for node in graph_nodes(functional_of(model)):
        counts[id(node.operation)] += 1
        if counts[id(node.operation)] == 1 and is_graph_model(node.operation):
            _call_counts(node.operation, counts)
    return counts


def _copy_with_bias(layer):
    """A fresh, unbuilt copy of a built-in linear layer, with a bias."""
    config = layer.get_config()
    core = config["layer"]["config"] if _fold_math.is_wrapped(layer) else config
    core["use_bias"] = True
    return type(layer).from_config(config)


def _write_folded_weights(layer, copy, steps):
    source, target = _fold_math.core_layer(layer), _fold_math.core_layer(copy)
    values = {
        role: np.asarray(getattr(source, role).numpy(), "float64")
        for role in _fold_math.ROLES
        if getattr(source, role, None) is not None
    }
    for position, s, t in steps:
        fold = _fold_math.fold_after if position == "after" else _fold_math.fold_before
        fold(source, values, s, t)
    for role, value in values.items():
        variable = getattr(target, role)
        variable.assign(value.astype(variable.dtype))
