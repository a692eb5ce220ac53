"""The streaming step as a TensorFlow function: its signature, its feed,
and the states the float step reaches over sequences (what int8 calibrates
on)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from kerasnorm.export.naming.names import FRAME
from kerasnorm.export.naming.names import step_output_names


def specs(plan, batch):
    specs = [tf.TensorSpec((batch, *plan.frame_shape), plan.dtype, name=FRAME)]
    specs += [
        tf.TensorSpec((batch, s.size), "float32", name=s.name) for s in plan.states
    ]
    return specs


def step_function(plan):
    """The signature function: named outputs `output_<i>` and the states."""

    def serve(x, *states):
        outputs, new_states = plan.step(x, list(states))
        named = dict(zip(step_output_names(len(outputs)), outputs, strict=True))
        for spec, state in zip(plan.states, new_states, strict=True):
            named[spec.name] = state
        return named

    return serve


def concrete_step(plan, batch_size):
    function = tf.function(step_function(plan), input_signature=specs(plan, batch_size))
    return function.get_concrete_function()


def feed(plan, frame, states=None):
    states = plan.initial_states(len(frame)) if states is None else states
    feed = {FRAME: tf.constant(frame)}
    feed.update(
        {s.name: tf.constant(v) for s, v in zip(plan.states, states, strict=True)}
    )
    return feed


def states_forward(plan, sequences):
    """Every step's frame and incoming states over `sequences`, run through
    the float step: `(frames, states)`, each `(time * batch, ...)`."""
    step = tf.function(lambda x, states: plan.step(x, states))
    states = [tf.constant(s) for s in plan.initial_states(len(sequences))]
    frames, seen = [], [[] for _ in plan.states]
    for t in range(sequences.shape[1]):
        frames.append(sequences[:, t])
        for kept, state in zip(seen, states, strict=True):
            kept.append(np.asarray(state))
        _, states = step(tf.constant(sequences[:, t]), states)
    return np.concatenate(frames), [np.concatenate(s) for s in seen]


def calibration_feed(plan, sequences, samples, batch_size):
    """int8 calibration samples of the step, by signature name: frames with
    the states the float model reaches there, at most `samples` (whole
    batches) spread evenly over the sequences and their steps."""
    frames, states = states_forward(plan, sequences)
    n = min(len(frames), samples) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"representative_data has {len(frames)} time steps, fewer than the "
            f"batch size {batch_size}."
        )
    chosen = np.linspace(0, len(frames) - 1, n).round().astype(int)
    # Token ids stay integers (the step takes them as the model does).
    feed = {FRAME: frames[chosen].astype(plan.dtype)}
    for spec, state in zip(plan.states, states, strict=True):
        feed[spec.name] = state[chosen]
    return feed
