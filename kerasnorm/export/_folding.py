"""Folding inference-mode BatchNormalization into adjacent linear layers.

The math is docs/design.md §4. At inference BN is the per-channel affine map
x * s + t with s = gamma / sqrt(moving_var + eps), t = beta - moving_mean * s.

- BN after a linear layer: scale the kernel along its output-channel axis by s,
  b' = b * s + t.
- BN before a linear layer: scale the kernel along its input-channel axis by s,
  b' = b + sum over input channels and kernel positions of W * t. Exact for
  Dense and "valid" convolutions; with any other padding (and for transposed
  convolutions, whose border outputs get fewer taps) only when t == 0.

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
import dataclasses
import functools

import keras
import numpy as np

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export import _parity
from kerasnorm.export._arguments import UNSET
from kerasnorm.export._arguments import renamed
from kerasnorm.export._model import all_layers
from kerasnorm.export._model import check_model
from kerasnorm.export._model import input_structure
from kerasnorm.export._model import is_graph_model
from kerasnorm.export._weight_norm import unwrap_weight_norm
from kerasnorm.norms.weight_norm import WeightNorm

L = keras.layers

# Exact types, not isinstance: a subclass may change `call`, and rewriting the
# kernel of a layer whose computation is unknown is not a fold.
_AFTER_OUTPUT_LAST = (L.Dense, L.Conv1D, L.Conv2D, L.Conv3D)
_TRANSPOSED = (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose)
_DEPTHWISE = (L.DepthwiseConv1D, L.DepthwiseConv2D)
_SEPARABLE = (L.SeparableConv1D, L.SeparableConv2D)
_LINEAR = (*_AFTER_OUTPUT_LAST, *_TRANSPOSED, *_DEPTHWISE, *_SEPARABLE)
# The weights a folded layer rewrites, by attribute: every weight these
# classes have once LoRA and quantization are ruled out.
_ROLES = ("kernel", "depthwise_kernel", "pointwise_kernel", "bias")
_ACTIVATIONS = (L.Activation, L.ReLU, L.LeakyReLU, L.PReLU, L.ELU, L.Softmax)


class FoldVerificationError(RuntimeError):
    """The folded model does not compute what the original model computes."""


@dataclasses.dataclass(frozen=True)
class FoldedBN:
    """One BatchNormalization merged into a linear layer."""

    batchnorm: str
    into: str
    position: str  # "after" (BN follows the layer) or "before"


@dataclasses.dataclass(frozen=True)
class KeptBN:
    """One BatchNormalization left in place, and why."""

    batchnorm: str
    reason: str


@dataclasses.dataclass
class FoldReport:
    """What `fold_batchnorm` folded and what it left in place.

    Layer names are paths through nested models: `"outer/inner/bn"`.
    """

    folded: list[FoldedBN] = dataclasses.field(default_factory=list)
    kept: list[KeptBN] = dataclasses.field(default_factory=list)
    # Paths of the WeightNorm wrappers replaced by their plain layer.
    weight_norms: list[str] = dataclasses.field(default_factory=list)
    # The self-check: max |folded - original| / max |original| in the
    # model's own precision, the same in float64 when that was re-checked
    # (None when it was not needed), and the shapes of the inputs it ran on.
    check_error: float | None = None
    check_error_float64: float | None = None
    check_shapes: list[tuple] = dataclasses.field(default_factory=list)

    def changes(self) -> int:
        """How many BNs were folded and WeightNorms removed."""
        return len(self.folded) + len(self.weight_norms)

    def __str__(self) -> str:
        lines = [f"BatchNorm folding: {len(self.folded)} folded, {len(self.kept)} kept"]
        lines += [
            f"  folded {f.batchnorm} -> {f.into} ({f.position})" for f in self.folded
        ]
        lines += [f"  kept   {k.batchnorm}: {k.reason}" for k in self.kept]
        if self.weight_norms:
            lines.append(f"WeightNorm removed: {len(self.weight_norms)}")
            lines += [f"  computed {name}'s kernel once" for name in self.weight_norms]
        if self.check_error is not None:
            shapes = ", ".join(str(tuple(shape)) for shape in self.check_shapes)
            line = f"Self-check: max error {self.check_error:.1e} of the output scale"
            if self.check_error_float64 is not None:
                line += f", {self.check_error_float64:.1e} in float64"
            lines.append(f"{line} (inputs {shapes})")
        return "\n".join(lines)


def fold_batchnorm(
    model: keras.Model,
    *,
    return_report: bool = False,
    verify_inputs=None,
    tolerance: float | None = None,
    check_inputs=UNSET,
) -> keras.Model | tuple[keras.Model, FoldReport]:
    """A copy of `model` with every foldable BatchNormalization merged away.

    Works on Functional and Sequential models, nested models, several inputs
    and outputs. BNs that cannot be folded exactly (activation in between,
    several consumers, axis not the channel axis, "same" padding with a
    non-zero shift, shared layers, training mode) stay in place and are listed
    in the report with the reason.

    The result is checked: both models run on `verify_inputs` and must agree
    within `tolerance` of each output's scale. When they do not, or when the
    model computes in float16 / bfloat16, both are rebuilt in float64 with
    the same weights, folded and compared again (docs/design.md §4): float
    rounding alone cannot pass the first comparison and fail that one, a
    wrong fold fails both. `FoldVerificationError` then names the layers
    whose outputs diverge first and gives both figures; the report has them
    too. Each run starts from, and leaves, the state the models had (a
    stateful RNN's states, non-trainable variables).

    The folded model is meant for inference and export. It shares the layers
    that folding leaves unchanged with `model` (the same objects, so every
    piece of their state carries over exactly); `model` itself is never
    modified, but training the folded copy would train those shared layers.

    Args:
        model: a built Functional or Sequential Keras model. Never modified.
        return_report: also return the `FoldReport`. Defaults to `False`.
        verify_inputs: model inputs (any structure `model` accepts) for the
            self-check. Defaults to `None`: two standard-normal samples of the
            input spec, integers below the smallest `Embedding.input_dim` (2
            without one), undefined dimensions 32, else the first of 16, 8,
            4, 2, 1 the model runs on.
        tolerance: allowed max |folded - original| / max |original| per
            output. Defaults to `None`: 1e-5, or 1e-2 / 5e-2 when a layer
            computes in float16 / bfloat16; the float64 re-check allows 1e-5.
        check_inputs: deprecated alias of `verify_inputs` (warns).

    Returns:
        The folded model, or `(folded_model, report)` with `return_report=True`.

    Example:

    ```python
    folded, report = fold_batchnorm(model, return_report=True)
    print(report)  # BatchNorm folding: 3 folded, 1 kept ...
    ```
    """
    verify_inputs = renamed(
        "fold_batchnorm", "verify_inputs", verify_inputs, "check_inputs", check_inputs
    )
    check_model(model, needs_graph=True)
    folded, report = _fold(model)
    _SelfCheck(model, folded, report, tolerance).run(verify_inputs)
    return (folded, report) if return_report else folded


def _fold(model):
    """The folded model and its report, unchecked."""
    report = FoldReport()
    folded = model
    while True:
        step = _Pass(folded)
        folded = step.run()
        report.folded += step.report.folded
        report.kept = step.report.kept
        report.weight_norms += step.report.weight_norms
        # A BN next to another BN (BN -> BN -> Dense), or next to a WeightNorm
        # wrapper, becomes foldable once its neighbour is gone: fold again
        # until a pass changes nothing.
        if not step.report.changes() or not step.report.kept:
            break
    return folded, report


# --- one pass: plan, then rebuild ---------------------------------------------


class _Pass:
    """One folding pass over a model and every model nested in it."""

    def __init__(self, model):
        self.model = model
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
        plan = _plan(functional_of(model), self.calls, prefix)
        self.report.folded += plan.folded
        self.report.kept += plan.kept
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
            changes_so_far = len(self.report.folded) + len(self.report.weight_norms)
            new = self.rebuild(op, f"{prefix}{op.name}/")
            if (
                len(self.report.folded) + len(self.report.weight_norms)
                == changes_so_far
            ):
                new = op  # nothing folded inside: keep the sub-model itself
        elif isinstance(op, WeightNorm):
            new = unwrap_weight_norm(op)
            self.report.weight_norms.append(prefix + op.name)
        elif id(op) in plan.steps:
            new = _copy_with_bias(op)
            self.rewrites.append((op, new, plan.steps[id(op)]))
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
    core = config["layer"]["config"] if _is_wrapped(layer) else config
    core["use_bias"] = True
    return type(layer).from_config(config)


def _write_folded_weights(layer, copy, steps):
    source, target = _core(layer), _core(copy)
    values = {
        role: np.asarray(getattr(source, role).numpy(), "float64")
        for role in _ROLES
        if getattr(source, role, None) is not None
    }
    for position, bn in steps:
        s, t = _scale_shift(bn)
        fold = _fold_after if position == "after" else _fold_before
        fold(source, values, s, t)
    for role, value in values.items():
        variable = getattr(target, role)
        variable.assign(value.astype(variable.dtype))


# --- planning -------------------------------------------------------------------


@dataclasses.dataclass
class _GraphPlan:
    """What one pass does in one graph."""

    steps: dict = dataclasses.field(default_factory=dict)  # id(layer) -> steps
    removed: set = dataclasses.field(default_factory=set)  # id(BN)
    folded: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """A way to fold one BN: the layer it merges into, or why there is none."""

    layer: keras.layers.Layer | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class _Wiring:
    """Who produces and who consumes each tensor of one graph."""

    producers: dict  # id(tensor) -> GraphNode
    consumers: dict  # id(tensor) -> [GraphNode or None for a model output]
    calls: collections.Counter

    @classmethod
    def of(cls, nodes, outputs, calls):
        producers, consumers = {}, collections.defaultdict(list)
        for node in nodes:
            producers.update((id(y), node) for y in node.outputs)
            for x in node.inputs:
                consumers[id(x)].append(node)
        for y in outputs:
            consumers[id(y)].append(None)
        return cls(producers, consumers, calls)


def _plan(graph, calls, prefix):
    plan = _GraphPlan()
    nodes = graph_nodes(graph)
    wiring = _Wiring.of(nodes, graph.outputs, calls)
    for node in nodes:
        bn = node.operation
        if type(bn) is not L.BatchNormalization:
            continue
        reason = _bn_unfoldable(bn, node, calls)
        if reason is None:
            after = _try_after(bn, node, wiring)
            before = None if after.layer else _try_before(bn, node, wiring)
            chosen = after if after.layer else before
            if chosen.layer is not None:
                position = "after" if chosen is after else "before"
                steps = plan.steps.setdefault(id(chosen.layer), [])
                # BN-before acts on the layer's input, so it goes first.
                steps.insert(len(steps) if position == "after" else 0, (position, bn))
                plan.removed.add(id(bn))
                plan.folded.append(
                    FoldedBN(prefix + bn.name, prefix + chosen.layer.name, position)
                )
                continue
            reason = f"{after.reason}; {before.reason}"
        plan.kept.append(KeptBN(prefix + bn.name, reason))
    return plan


def _bn_unfoldable(bn, node, calls):
    if calls[id(bn)] > 1:
        return "the BatchNormalization layer is shared (called more than once)"
    if node.kwargs.get("training") is True:
        return "called with training=True"
    return None


def _try_after(bn, node, wiring):
    x = node.inputs[0]
    producer = wiring.producers.get(id(x))
    if producer is None:
        return _Attempt(reason="after: its input is an input of this model")
    layer = producer.operation
    where = f"after {layer.name!r}"
    if isinstance(layer, L.BatchNormalization):
        return _Attempt(reason=f"{where}: BatchNormalization")
    if isinstance(layer, _ACTIVATIONS):
        return _Attempt(reason=f"{where}: activation in between")
    problem = _layer_unfoldable(layer, x, bn, wiring.calls)
    if problem is None and _activation_name(_core(layer)) != "linear":
        problem = f"activation {_activation_name(_core(layer))!r} in between"
    if problem is None and len(wiring.consumers[id(x)]) > 1:
        problem = "its output feeds several consumers"
    if problem:
        return _Attempt(reason=f"{where}: {problem}")
    return _Attempt(layer)


def _try_before(bn, node, wiring):
    y = node.outputs[0]
    users = wiring.consumers[id(y)]
    if len(users) != 1 or users[0] is None:
        return _Attempt(
            reason="before: its output feeds several consumers or is a model output"
        )
    layer = users[0].operation
    where = f"before {layer.name!r}"
    if isinstance(layer, L.BatchNormalization):
        return _Attempt(reason=f"{where}: BatchNormalization")
    problem = _layer_unfoldable(layer, y, bn, wiring.calls) or _border_problem(
        layer, bn
    )
    if problem:
        return _Attempt(reason=f"{where}: {problem}")
    return _Attempt(layer)


def _layer_unfoldable(layer, x, bn, calls):
    core = _core(layer)
    if core is None:
        return f"not a foldable linear layer ({type(layer).__name__})"
    if calls[id(layer)] > 1:
        return "its weights are shared (layer called more than once)"
    if getattr(core, "lora_enabled", False):
        return "LoRA is enabled"
    if getattr(core, "quantization_mode", None):
        return f"quantized ({core.quantization_mode})"
    if bn.axis % len(x.shape) != _channel_axis(layer, x):
        return "BN axis is not the channel axis"
    return None


def _border_problem(layer, bn):
    """Why a BN shift does not fold into `layer`'s input, if it does not."""
    if not np.any(_scale_shift(bn)[1]):
        return None
    core = _core(layer)
    if isinstance(core, _TRANSPOSED):
        return (
            "a transposed convolution gives border outputs fewer taps, so a "
            "non-zero BN shift does not fold"
        )
    padding = getattr(core, "padding", "valid")
    if padding != "valid":
        return (
            f"padding={padding!r} pads with zeros that BN would have shifted "
            "(exact only for 'valid' padding or a zero shift)"
        )
    return None


def _is_wrapped(layer):
    return type(layer) is L.TimeDistributed


def _core(layer):
    """The linear layer that holds the weights, or None if there is none.

    `TimeDistributed` applies its inner layer to every step of axis 1: a BN
    after or before it folds into that inner layer like into the bare layer.
    """
    inner = layer.layer if _is_wrapped(layer) else layer
    return inner if type(inner) in _LINEAR else None


def _activation_name(layer):
    activation = getattr(layer, "activation", None)
    if activation is None:
        return "linear"
    return keras.activations.serialize(activation)


def _channel_axis(layer, x):
    if getattr(_core(layer), "data_format", "channels_last") == "channels_first":
        return 2 if _is_wrapped(layer) else 1
    return len(x.shape) - 1


# --- the math (docs/design.md §4) -------------------------------------------------


def _scale_shift(bn):
    """s and t of BN's inference affine map, in float64."""
    mean = np.asarray(bn.moving_mean.numpy(), "float64")
    var = np.asarray(bn.moving_variance.numpy(), "float64")
    gamma = np.asarray(bn.gamma.numpy(), "float64") if bn.scale else 1.0
    beta = np.asarray(bn.beta.numpy(), "float64") if bn.center else 0.0
    s = gamma / np.sqrt(var + bn.epsilon) * np.ones_like(mean)
    t = beta - mean * s
    return s, t


def _fold_after(layer, values, s, t):
    """y' = y * s + t: scale the output-channel axis, shift the bias."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, _SEPARABLE):
        values["pointwise_kernel"] = values["pointwise_kernel"] * s
    elif isinstance(layer, _DEPTHWISE):
        kernel = values["kernel"]
        values["kernel"] = kernel * s.reshape(kernel.shape[-2:])
    elif isinstance(layer, _TRANSPOSED):
        values["kernel"] = values["kernel"] * s[:, None]
    else:
        values["kernel"] = values["kernel"] * s
    values["bias"] = bias * s + t


def _fold_before(layer, values, s, t):
    """y = W(x * s + t) + b: scale the input-channel axis, bias += sum W * t."""
    bias = values.get("bias", 0.0)
    if isinstance(layer, L.Dense):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        values["bias"] = bias + t @ kernel
    elif isinstance(layer, _SEPARABLE):
        depthwise = values["depthwise_kernel"]
        pointwise = values["pointwise_kernel"]
        values["depthwise_kernel"] = depthwise * s[:, None]
        spatial = tuple(range(depthwise.ndim - 2))
        shifted = (depthwise * t[:, None]).sum(axis=spatial).reshape(-1)
        values["bias"] = bias + shifted @ pointwise.reshape(-1, pointwise.shape[-1])
    elif isinstance(layer, _DEPTHWISE):
        kernel = values["kernel"]
        values["kernel"] = kernel * s[:, None]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[:, None]).sum(axis=spatial).reshape(-1)
    elif isinstance(layer, _TRANSPOSED):
        values["kernel"] = values["kernel"] * s  # t == 0 here (_border_problem)
        values["bias"] = bias + np.zeros(values["kernel"].shape[-2])
    else:
        kernel = values["kernel"]  # (..., in / groups, out)
        cin_g, cout = kernel.shape[-2:]
        cout_g = cout // layer.groups
        # Input channel of kernel row i for output o: group(o) * cin_g + i.
        index = (np.arange(cout) // cout_g)[None, :] * cin_g + np.arange(cin_g)[:, None]
        values["kernel"] = kernel * s[index]
        spatial = tuple(range(kernel.ndim - 2))
        values["bias"] = bias + (kernel * t[index]).sum(axis=(*spatial, -2))


# --- the self-check ---------------------------------------------------------------


class _SelfCheck:
    """Run the original and the folded model side by side; raise on mismatch.

    Every run leaves the models' non-trainable state as it found it: the
    folded model shares the unchanged layers with the original, so a
    stateful RNN's state advanced by the original's run would otherwise be
    the folded run's initial state (a false mismatch), and the user's model
    would come back with a different state.
    """

    def __init__(self, original, folded, report, tolerance):
        self.original = original
        self.folded = folded
        self.report = report
        self.given_tolerance = tolerance
        self.tolerance = (
            _parity.fold_tolerance(original) if tolerance is None else tolerance
        )
        variables = {}
        for m in (original, folded):
            for v in [*m.non_trainable_variables, *_rnn_states(m)]:
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
        if inputs is None:
            inputs = keras.tree.pack_sequence_as(
                input_structure(self.original), _parity.sample_inputs(self.original, 2)
            )
        error = self.error(inputs)
        self.report.check_error = error
        self.report.check_shapes = [
            tuple(np.shape(x)) for x in keras.tree.flatten(inputs)
        ]
        if error <= self.tolerance and not _parity.half_precision(self.original):
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
        original = _parity.float64_twin(self.original)
        folded, report = _fold(original)
        if [f.batchnorm for f in report.folded] != [
            f.batchnorm for f in self.report.folded
        ]:
            raise RuntimeError("the float64 model folds differently")
        tolerance = (
            _parity.FLOAT64_TOLERANCE
            if self.given_tolerance is None
            else self.given_tolerance
        )
        inputs64 = keras.tree.map_structure(_parity.as_float64, inputs)
        return _SelfCheck(original, folded, report, tolerance), inputs64

    def _diverging(self, inputs):
        """Which top-level layers' outputs diverge first, as a sentence."""
        original = _tensors_by_call(self.original)
        for fold in self.report.folded:
            bn_output = (fold.batchnorm, 0, 0)
            if fold.position == "after" and bn_output in original:
                # The folded layer's output stands for the BN's output.
                original[(fold.into, 0, 0)] = original.pop(bn_output)
        folded = _tensors_by_call(self.folded)
        keys = [key for key in folded if key in original]
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


def _rnn_states(model):
    """The state variables of `model`'s stateful RNN layers, which Keras
    keeps out of `non_trainable_variables`."""
    return [
        v
        for layer in all_layers(model)
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
