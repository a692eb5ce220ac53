"""Streaming exports: one time step per call, the recurrent states carried by
the caller (`to_tflite(..., streaming=True)`, `to_saved_model(...,
streaming=True)`).

A sequence model `(batch, time, features) -> ...` whose recurrent layers run
forward over time, with layers around them that act on each time step on its
own, is the same function as a step `(x_t, states_{t-1}) -> (y_t, states_t)`
run from zero states. The step is built here from the model's own layers: the
per-step layers are called on a length-1 sequence `x_t[:, None]` (so their
axes mean what they meant in the sequence model), and each recurrent layer is
replaced by one call of its cell, with the layer's own weight objects. The
step has no loop, so every quantize mode, int8 included, converts it.

A layer whose output at step t depends on other steps (a convolution over
time, attention, pooling over time, a backward or bidirectional recurrent
layer, statistics over the time axis) cannot be split that way and is refused
by name. A recurrent layer with `return_sequences=False` ends the time axis:
what follows it sees the last output, and the step computes, at every step,
what the sequence model outputs for the sequence ending there.

A token model, `(batch, time)` integer ids into an `Embedding`, streams one
id per call: the frame is `(batch,)`, and a layer before the embedding may
only act elementwise (the last axis of `(batch, time)` is time). A mask
(`Embedding(mask_zero=True)`) is followed through the step as Keras follows
it through the sequence model; at a recurrent layer a masked step keeps
the previous states and output, as Keras' `rnn` does (the previous output
is the previous first state, as for every Keras and kerasnorm cell), or
gives zeros with `zero_output_for_mask=True`.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras import ops

from kerasnorm._compat import functional_of
from kerasnorm._compat import graph_nodes
from kerasnorm.export.naming import names
from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.streaming.rules import TIME_AXIS
from kerasnorm.export.streaming.rules import mask_operation_problem
from kerasnorm.export.streaming.rules import mixing_problem
from kerasnorm.export.streaming.rules import recurrent_problem
from kerasnorm.export.streaming.rules import token_problem

# Sequence length of the random verification sequences when the model's
# time axis is undefined and no inputs are given.
DEFAULT_STEPS = 16


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One recurrent state of the step: its signature name and width."""

    name: str  # `state_<layer>_<i>`
    layer: keras.layers.RNN
    index: int
    size: int


@dataclasses.dataclass
class _Value:
    """A tensor of the step graph; `per_step` tells a time step `(batch, 1,
    ...)` of a sequence tensor from the result of a `return_sequences=False`
    layer `(batch, ...)`; `tokens` a time step `(batch, 1)` of a `(batch,
    time)` token input, not embedded yet. `tensor` is None while the model
    is only checked."""

    tensor: object
    per_step: bool
    tokens: bool = False


class StepPlan:
    """The step function of a sequence model, checked: what it takes and gives.

    Raises `ExportConversionError` naming the first layer that mixes time
    steps, and `ValueError` for a model that is not a sequence model.
    """

    def __init__(self, model: keras.Model):
        # `model` is checked already (`prepare` checks it once per export).
        self.model = model
        self.graph = functional_of(model)
        if self.graph is None:
            raise ValueError(
                "streaming=True needs a Functional or Sequential model, whose "
                "layers can be called one time step at a time. Received: a "
                f"{type(model).__name__}"
            )
        ranks = [len(x.shape) for x in model.inputs]
        dtype = keras.backend.standardize_dtype(model.inputs[0].dtype)
        token_ids = ranks == [2] and "int" in dtype
        if len(ranks) != 1 or not (ranks == [3] or token_ids):
            shapes = [tuple(x.shape) for x in model.inputs]
            raise ValueError(
                "streaming=True needs a model with one sequence input of shape "
                "(batch, time, features), or of integer token ids (batch, "
                f"time) into an Embedding. Received input shape(s) {shapes}"
            )
        sequence = model.inputs[0]
        self.tokens = token_ids
        if not self.tokens and sequence.shape[-1] is None:
            raise ValueError(
                "streaming=True needs the feature size of the input defined. "
                f"Received input shape {tuple(sequence.shape)}"
            )
        self.steps = sequence.shape[TIME_AXIS]  # None: any length
        # One frame: a feature vector, or one token id per stream.
        self.frame_shape = () if self.tokens else (int(sequence.shape[-1]),)
        self.dtype = keras.backend.standardize_dtype(sequence.dtype)
        self.states: list[StateSpec] = []
        self._seen = set()
        outputs = self._walk(None, None)
        self.per_step_outputs = [value.per_step for value in outputs]

    def initial_states(self, batch):
        """Zero states for `batch` streams, in `states` order."""
        return [np.zeros((batch, s.size), "float32") for s in self.states]

    def step(self, frame, states):
        """`(outputs, new_states)` of one time step: `frame` is `(batch,
        features)`, `states` a list in `self.states` order."""
        by_layer = {}
        for spec, state in zip(self.states, states, strict=True):
            by_layer.setdefault(id(spec.layer), []).append(state)
        new = {}
        outputs = self._walk(frame, (by_layer, new))
        values = [v.tensor[:, 0] if v.per_step else v.tensor for v in outputs]
        new_states = [new[id(s.layer)][s.index] for s in self.states]
        return values, new_states

    def _walk(self, frame, states):
        """Run (states given) or check (`frame` None) the graph, one step."""
        start = {id(self.graph.inputs[0]): _Value(frame, True, self.tokens)}
        if frame is not None:
            start[id(self.graph.inputs[0])].tensor = ops.expand_dims(frame, 1)
        values = self._run_graph(self.graph, start, states)
        return [values[id(t)] for t in keras.tree.flatten(self.graph.outputs)]

    def _run_graph(self, graph, values, states):
        for node in graph_nodes(graph):
            ins = [values[id(t)] for t in node.inputs]
            inner = functional_of(node.operation)
            if inner is not None:
                sub = {
                    id(t): v
                    for t, v in zip(keras.tree.flatten(inner.inputs), ins, strict=True)
                }
                sub = self._run_graph(inner, sub, states)
                outs = [sub[id(t)] for t in keras.tree.flatten(inner.outputs)]
            else:
                outs = self._call(node, ins, states)
            for tensor, value in zip(node.outputs, outs, strict=True):
                values[id(tensor)] = value
        return values

    def _call(self, node, ins, states):
        layer = node.operation
        if isinstance(layer, keras.layers.RNN):
            return [self._recurrent(layer, node, ins, states)]
        if not isinstance(layer, keras.layers.Layer):
            return self._operation(node, ins, states)
        # A tensor given by keyword (the `mask=` Keras passes a BatchNorm,
        # say) is passed by keyword again; the rules judge the others.
        by_id = {id(t): v for t, v in zip(node.inputs, ins, strict=True)}
        keywords = {id(t) for t in keras.tree.flatten(node.kwargs)}
        ins = [
            v for t, v in zip(node.inputs, ins, strict=True) if id(t) not in keywords
        ]
        per_step = [v.per_step for v in ins]
        if not any(per_step):
            # After the time axis ended every layer sees whole-sequence values.
            problem = None
        elif not all(per_step):
            problem = (
                "combines a time step with the output of a return_sequences="
                "False layer, which depends on the whole sequence"
            )
        else:
            problem = mixing_problem(layer)
        tokens = any(v.tokens for v in ins)
        if tokens and not problem:
            problem = token_problem(layer)
            tokens = not isinstance(layer, keras.layers.Embedding)
        if problem:
            _refuse(layer, problem)
        if states is None:
            return [_Value(None, any(per_step), tokens) for _ in node.outputs]
        args = [v.tensor for v in ins]
        kwargs = {
            k: by_id[id(a)].tensor if isinstance(a, keras.KerasTensor) else a
            for k, a in node.kwargs.items()
        }
        kwargs["training"] = False
        result = layer(args if len(args) > 1 else args[0], **kwargs)
        results = keras.tree.flatten(result)
        return [_Value(t, any(per_step), tokens) for t in results]

    def _operation(self, node, ins, states):
        """A `keras.ops` call of the graph: the mask of an `Embedding(
        mask_zero=True)` or a `Masking` layer (`not_equal`, `any` over the
        features), which acts on each step on its own; any other is
        refused."""
        tokens = any(v.tokens for v in ins)
        per_step = any(v.per_step for v in ins)
        problem = mask_operation_problem(node.operation, node.kwargs, tokens)
        if problem:
            _refuse(node.operation, problem)
        if states is None:
            return [_Value(None, per_step, tokens) for _ in node.outputs]
        tensors = {id(t): v.tensor for t, v in zip(node.inputs, ins, strict=True)}
        args = [
            tensors[id(a)] if isinstance(a, keras.KerasTensor) else a for a in node.args
        ]
        kwargs = {
            k: tensors[id(a)] if isinstance(a, keras.KerasTensor) else a
            for k, a in node.kwargs.items()
        }
        results = keras.tree.flatten(node.operation(*args, **kwargs))
        return [_Value(t, per_step, tokens) for t in results]

    def _recurrent(self, layer, node, ins, states):
        # A mask reaches the layer as its `mask=` argument.
        mask = node.kwargs.get("mask")
        if isinstance(mask, keras.KerasTensor):
            pairs = list(zip(node.inputs, ins, strict=True))
            ins = [v for t, v in pairs if t is not mask]
            mask = next(v for t, v in pairs if t is mask)
        else:
            mask = None
        problem = recurrent_problem(layer)
        if problem is None and len(ins) != 1:
            problem = "is called with initial states; the step starts from zeros"
        if problem is None and not ins[0].per_step:
            problem = (
                "runs over the output of a return_sequences=False layer, "
                "which depends on the whole sequence"
            )
        if problem is None and states is None and id(layer) in self._seen:
            problem = "is called more than once; each call would need its own state"
        if problem:
            _refuse(layer, problem)
        sizes = [int(s) for s in keras.tree.flatten(layer.cell.state_size)]
        if states is None:
            self._seen.add(id(layer))
            self.states.extend(
                StateSpec(
                    names.state_name(layer.name, i),
                    layer,
                    i,
                    size,
                )
                for i, size in enumerate(sizes)
            )
            return _Value(None, layer.return_sequences)
        by_layer, new = states
        structure = (
            layer.cell.state_size
            if keras.tree.is_nested(layer.cell.state_size)
            else [layer.cell.state_size]
        )
        flat_previous = by_layer[id(layer)]
        previous = keras.tree.pack_sequence_as(structure, flat_previous)
        output, next_states = layer.cell(ins[0].tensor[:, 0], previous, training=False)
        next_states = keras.tree.flatten(next_states)
        if mask is not None:
            output, next_states = _masked(
                layer, mask.tensor, output, next_states, flat_previous
            )
        new[id(layer)] = next_states
        if layer.return_sequences:
            output = ops.expand_dims(output, 1)
        return _Value(output, layer.return_sequences)


def _masked(layer, mask, output, states, previous):
    """A recurrent step under a mask `(batch, 1)`, as Keras' `rnn` computes
    it: where the step is masked, the previous states, and the previous
    output (the previous first state) or zeros (`zero_output_for_mask`)."""
    keep = ops.cast(mask, "bool")  # (batch, 1), broadcast over features
    states = [ops.where(keep, s, p) for s, p in zip(states, previous, strict=True)]
    if getattr(layer, "zero_output_for_mask", False):
        output = ops.where(keep, output, ops.zeros_like(output))
    else:
        output = ops.where(keep, output, previous[0])
    return output, states


def _refuse(layer, problem):
    """Raise the refusal of `layer`, quoting the rules' `problem`."""
    raise ExportConversionError(
        f"Cannot export layer {layer.name!r} ({type(layer).__name__}) as a "
        f"streaming step: it {problem}. A streaming step sees one time step "
        "per call; export the model without streaming=True for whole "
        "sequences."
    )
