"""Smoothing a decoder's final norm into its head (docs/design.md,
"Smoothing a norm's output"): the same per-channel rescaling as
`fold.smooth`, at the one site it leaves out, the keras-hub CausalLM's
last norm read by the token table (`ReversibleEmbedding(..., reverse=True)`).

The head `logits = y T^T` rounds the table `T` (vocabulary by channels) to
int8 per row: each row's step is set by its largest channel, and a
trained model's table carries a few channels several times the rest
(Gemma 3 270M: the largest channel maximum 5x the median), so every row
rounds its ordinary channels coarsely. Scaling the table's channel `j` by
`s_j` and the norm's gain by `1 / s_j` computes the same logits. A tied
table is also the embedding lookup: its rows are divided by `s` again
right after the lookup (one multiply per token), so the model computes the
same function in exact arithmetic. An untied head (`reverse_embeddings`)
is rescaled alone.

`s_j = max|y_j|^a / max|T_j|^(1 - a)`, the strength `a` searched (none,
`fold.smooth.ROW_STRENGTHS`) on the simulated int8 head: `activations`
says how the product quantizes its input, as in `fold.smooth`. The search
runs on a seeded sample of the vocabulary (`HEAD_SAMPLE` rows of the
table), the scale on the whole table; a strength is taken only where it
cuts the simulated error by enough (`HEAD_MIN_CUT`).
"""

from __future__ import annotations

import keras
import numpy as np

from kerasnorm._compat import replace_method
from kerasnorm._compat import restore_method
from kerasnorm.export.fold.self_check import self_check
from kerasnorm.export.fold.smooth import Smoothed
from kerasnorm.export.fold.smooth import _choose
from kerasnorm.export.fold.smooth import _gain
from kerasnorm.export.fold.smooth import _gain_variables
from kerasnorm.export.fold.smooth import _norm_outputs
from kerasnorm.export.fold.smooth import _rescale_gain
from kerasnorm.export.fold.smooth import _spread

# Rows of the table (vocabulary entries) the strength search simulates: a
# 262,144-entry table's full product on 4,096 rows would take minutes.
HEAD_SAMPLE = 16384
# The head is smoothed only where the search's error is at most this
# fraction of the unsmoothed head's. A smaller cut measured no better on a
# real model: SmolLM2-135M-Instruct's weight-only int8 head, error 0.67x,
# wrote a file whose top-1 agreement fell 0.982 -> 0.971 on the paragraph
# (perplexity 1.005x -> 1.003x), near ties flipped either way; its
# dynamic head (0.52x) 0.931 -> 0.942 (1.026x -> 1.016x) and Gemma 3
# 270M's weight-only head (0.21x) 0.938 -> 0.971 (docs/benchmarks.md).
HEAD_MIN_CUT = 0.6
# Calibration rows the head search simulates (its products are rows by
# `HEAD_SAMPLE` in float64).
HEAD_ROWS = 1024
# Vocabulary entries the table's maxima and scaling read at a time.
BLOCK = 8192


def head_site(model):
    """`(norm, embedding)`: a keras-hub CausalLM's final norm and its
    token embedding, when the norm has a per-channel gain and the
    embedding computes the head (`call(x, reverse=True)`); else None."""
    backbone = getattr(model, "backbone", None)
    norm = getattr(backbone, "layer_norm", None)
    embedding = getattr(backbone, "token_embedding", None)
    if norm is None or embedding is None or _gain(norm) is None:
        return None
    if type(embedding).__name__ != "ReversibleEmbedding":
        return None
    return norm, embedding


def smooth_head(model, data, activations, strength=None):
    """Smooth `model`'s head site in place (`head_site`); returns the
    `Smoothed` entry (None: no site, or no strength errs less than none)
    and a function that puts the weights back exactly. `data` calibrates
    the norm's channel maxima; `strength` a float in [0, 1], or None to
    search. Raises ValueError (the weights put back) when the smoothed
    model computes something else than before, beyond float32 rounding."""
    site = head_site(model)
    if site is None:
        return None, lambda: None
    norm, embedding = site
    tied = getattr(embedding, "tie_weights", True)
    table = embedding.embeddings if tied else embedding.reverse_embeddings
    # The table as it is (the copy restore() puts back), and the head's
    # kernel `[channels, vocabulary]` as a view of it: a 262,144-entry
    # table is 0.67 GB in float32, and every float64 copy of it doubled that.
    values = table.numpy()
    kernel = values.T if tied else values
    (y,) = _norm_outputs(model, [norm], data)
    chosen, scale = _choose(
        y[:HEAD_ROWS],
        (),
        strength,
        activations,
        simulated=[_sample(kernel).astype("float64")],
        min_cut=HEAD_MIN_CUT,
        maxima=_row_maxima(kernel),
    )
    if scale is None:
        return None, lambda: None
    before = keras.tree.flatten(model(data, training=False))
    saved = [(v, v.numpy()) for v in _gain_variables(norm)] + [(table, values)]
    call = embedding.__dict__.get("call")

    def restore():
        if tied:
            restore_method(embedding, "call", call)
        for variable, value in saved:
            variable.assign(value)

    _rescale_gain(norm, scale)
    table.assign(_scaled(values, scale, tied))
    if tied:
        replace_method(embedding, "call", _looked_up(embedding.call, 1.0 / scale))
    try:
        self_check(model, before, data)
    except ValueError:
        restore()
        raise
    act = np.abs(y).max(axis=0)
    done = Smoothed(
        norm.name, (embedding.name,), chosen, _spread(act), _spread(act / scale)
    )
    return done, restore


def _looked_up(call, inverse):
    """The embedding's call with its lookup's rows divided by the scale
    again; the head (`reverse=True`) unchanged."""

    def looked_up(inputs, reverse=False, **kwargs):
        out = call(inputs, reverse=reverse, **kwargs)
        if reverse:
            return out
        return keras.ops.multiply(out, keras.ops.cast(inverse, out.dtype))

    return looked_up


def _row_maxima(kernel):
    """Each row's largest magnitude of a `[channels, vocabulary]` kernel,
    a block of `BLOCK` vocabulary entries at a time (no whole copy)."""
    maxima = np.zeros(kernel.shape[0], "float64")
    for start in range(0, kernel.shape[1], BLOCK):
        block = np.abs(kernel[:, start : start + BLOCK]).max(axis=1).astype("float64")
        maxima = np.maximum(maxima, block)
    return maxima


def _scaled(values, scale, tied):
    """The table `values` with each channel multiplied by `scale`, in
    float64 and cast back to the table's dtype, a block of `BLOCK`
    vocabulary entries at a time; both read as the head's kernel
    `[channels, vocabulary]` (a tied table transposed)."""
    out = np.empty_like(values)
    kernel, scaled = (values.T, out.T) if tied else (values, out)
    for start in range(0, kernel.shape[1], BLOCK):
        block = kernel[:, start : start + BLOCK].astype("float64") * scale[:, None]
        scaled[:, start : start + BLOCK] = block.astype(values.dtype)
    return out


def _sample(kernel):
    """A seeded sample of `HEAD_SAMPLE` of the kernel's columns (the
    vocabulary), in their order; the kernel where it has no more."""
    columns = kernel.shape[1]
    if columns <= HEAD_SAMPLE:
        return kernel
    picked = np.random.default_rng(0).choice(columns, HEAD_SAMPLE, replace=False)
    return kernel[:, np.sort(picked)]
