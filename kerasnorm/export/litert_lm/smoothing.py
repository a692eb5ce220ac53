"""Norm-aware smoothing of a decoder before its quantized generative file
is written (`to_litert_lm`'s `smooth`; docs/design.md, "Smoothing a norm's
output", and docs/guides/generation.md, "Quantizing a real model").

Each norm read only by linear products (the attention's query, key and
value; a gated feed-forward's gate and up), and each gated feed-forward's
down product (its input `act(gate(x)) * up(x)`, the up product's output
channels taking the scale), is rescaled per channel: the same function in
float, while the int8 rounding of the products meets channels of one range
(`fold.smooth`). The scale's strength is searched per site on the
check's own prompts, against the product's int8 weights (`MODE_ACTIVATIONS`
says why). The final norm is smoothed into the token table where the
mode's row says so (`GenerativeMode.head`, `fold.smooth_head`), whatever
the blocks' default; `smooth=False` turns both off.

The model's weights change in place while the file is written and are put
back exactly when it is done (a model rebuilt from its config can lose
what ties its layers); a model Keras quantized (its integers are what it
validated) is not smoothed.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from kerasnorm.export.fold.smooth import FLOAT
from kerasnorm.export.fold.smooth import smooth
from kerasnorm.export.fold.smooth_head import head_site
from kerasnorm.export.fold.smooth_head import smooth_head
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

# The product the strength search simulates (`fold.smooth`): the weights'
# int8 rounding alone (float inputs), in every mode. Measured on
# SmolLM2-135M-Instruct (export/real_error_sources.py, simulated in Keras):
# searched so, the dynamic simulation agreed 0.964 teacher-forced; against
# the dynamic per-row product, 0.928 (the search moved the activations'
# spread into the weights); unsmoothed 0.912. Which modes take `smooth`,
# and smooth by default: `GenerativeMode.smooth`.
ACTIVATIONS = FLOAT
# Tokens of the check's prompts the search calibrates on, at most.
CALIBRATION_TOKENS = 512


@dataclasses.dataclass(frozen=True)
class Smoothing:
    """What smoothing did: the sites rescaled (`fold.smooth.Smoothed`), and
    in words what it did or why it did not."""

    smoothed: tuple
    said: str


def checked_smooth(smooth_option, quantize):
    """`smooth` as `to_litert_lm` takes it: None (the mode's default),
    False, True or a strength in [0, 1]."""
    if smooth_option is None or smooth_option is False or smooth_option is True:
        valid = True
    else:
        valid = (
            isinstance(smooth_option, (int, float))
            and not isinstance(smooth_option, bool)
            and 0.0 <= smooth_option <= 1.0
        )
    if not valid:
        raise ValueError(
            "to_litert_lm: `smooth` is None (the mode's default), False (off), "
            "True (the strength searched per norm) or a strength in [0, 1]. "
            f"Received: smooth={smooth_option!r}"
        )
    if smooth_option not in (None, False) and GENERATIVE_MODES[quantize].smooth is None:
        takes = ", ".join(
            repr(name) for name, m in GENERATIVE_MODES.items() if m.smooth is not None
        )
        raise ValueError(
            "to_litert_lm: `smooth` rescales the channels an int8 or int4 "
            f"product rounds; it means nothing with quantize={quantize!r}. "
            f"Pass quantize= one of {takes}, or no smooth. Received: "
            f"smooth={smooth_option!r}"
        )
    return smooth_option


@contextlib.contextmanager
def smoothed(model, prompts, quantize, smooth_option, length, keras_quantized=False):
    """While active, `model`'s norms and gated feed-forwards are smoothed
    for `quantize` (calibrated on `prompts`, as one sequence of at most
    `length` tokens); yields a `Smoothing`. The weights are put back on
    exit."""
    mode = GENERATIVE_MODES[quantize]
    if mode.smooth is None or smooth_option is False:
        yield Smoothing((), "off")
        return
    if keras_quantized:
        yield Smoothing((), "off: the model's integers are Keras' own")
        return
    data = _calibration(model, prompts, length)
    with _smoothed_head(model, data, mode.head) as (head, head_said):
        if smooth_option is None and not mode.smooth:
            off = f"off (not the default of quantize={quantize!r})"
            yield Smoothing(head, off + head_said)
            return
        strength = None if smooth_option in (None, True) else float(smooth_option)
        try:
            done, restore = smooth(
                model, data, strength, activations=ACTIVATIONS, gated=True
            )
        except ValueError as err:
            # The smoothed model computed something else: put back, said.
            yield Smoothing(head, f"off: {err}{head_said}")
            return
        try:
            if done:
                said = f"{len(done)} sites smoothed"
            else:
                said = "no site found: no norm read by linear products only"
            yield Smoothing((*done, *head), said + head_said)
        finally:
            restore()


@contextlib.contextmanager
def _smoothed_head(model, data, activations):
    """While active, the head smoothed (`fold.smooth_head`) where the mode
    smooths it (`activations` not None); yields `((Smoothed,) or (), what
    was done in words, to follow the blocks')`."""
    if activations is None or head_site(model) is None:
        yield (), ""
        return
    try:
        done, restore = smooth_head(model, data, activations)
    except ValueError:
        # Computed something else: put back, left unsmoothed.
        yield (), "; the head left as it is (smoothed, it computed something else)"
        return
    try:
        if done is None:
            yield (), "; the head left as it is (no strength cut its error enough)"
        else:
            yield (done,), f"; the head smoothed (strength {done.strength:g})"
    finally:
        restore()


def _calibration(model, prompts, length):
    """The check's prompts as one sequence in `model`'s input structure."""
    ids = [int(i) for prompt in prompts for i in prompt]
    ids = ids[: min(length, CALIBRATION_TOKENS)]
    tokens = np.asarray([ids], np.int32)
    if _is_causal_lm(model):
        return {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
    return tokens


def _is_causal_lm(model):
    try:
        import keras_hub
    except ImportError:
        return False
    return isinstance(model, keras_hub.models.CausalLM)
