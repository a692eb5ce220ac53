"""The generative file checked against the model's full forward pass.

The reference is the Keras model called on the whole sequence without a
cache: a causal model's row `p` depends on tokens `<= p` only, so one call
on the finished sequence gives every step's reference logits.

- float32: the file generates greedily from each prompt (`Generator`); every
  step's logits are within `FLOAT32_TOLERANCE` of the reference's largest
  magnitude, and each chosen token is the reference's argmax (unless the
  reference's top two are closer than that tolerance: a tie either may take).
- quantized files: teacher-forced on the reference's own greedy
  continuation, the fraction of steps whose argmax agrees is at least the
  mode's `min_agreement`, and the logits' rms error over the reference's
  rms is at most its `tolerance` (`options.generative_modes`, one row per
  mode).
- a file written from the float32 copy of a model held in half precision
  is checked as above against the copy, then teacher-forced against the
  half-precision model itself (`half=` its compute dtype): its greedy
  choice on at least `MIN_AGREEMENT` of the steps, the rms error within
  `HALF_RMS_TOLERANCE` (plus the mode's).
- every prefill signature besides, called once on a full chunk of ids from
  position 0: the rows it returns (its last row's, or every row's with
  `prefill_logits="all"`) against the reference's rows of those ids, under
  the same tolerances (a prompt shorter than the signature does not reach
  its last row: `Generator` decodes the prompt's last id).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

FLOAT32_TOLERANCE = 1e-4
# Teacher-forced top-1 agreement a file written from a half-precision
# model's float32 copy must reach against the model itself.
MIN_AGREEMENT = 0.9
# rms(file - reference) / rms(reference) per quantize mode (the table's
# `tolerance`, `options.generative_modes`).
RMS_TOLERANCE = {
    name: mode.tolerance
    for name, mode in GENERATIVE_MODES.items()
    if mode.tolerance is not None
}
# The same, added for the model held in half precision that a float32 copy
# was written from: its own rounding (2^-8 per op in bfloat16) against the
# file's float32 arithmetic.
HALF_RMS_TOLERANCE = {"float16": 0.02, "bfloat16": 0.1}
NEW_TOKENS = 12


@dataclasses.dataclass
class GenerationCheck:
    """What the check measured, over all prompts."""

    prompts: int
    steps: int
    invented_prompts: bool
    max_error: float  # max |file - reference| / max |reference|, float32
    agreement: float  # fraction of steps whose argmax agrees
    rms_error: float  # rms(file - reference) / rms(reference)


def reference_logits(model, ids):
    """The model's logits `(len(ids), vocab)` on `ids`, without a cache."""
    tokens = np.asarray([ids], np.int32)
    if _is_causal_lm(model):
        inputs = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
        if "position_ids" in _input_names(model):
            # Gemma 4's backbone takes its rotary positions as an input.
            inputs["position_ids"] = np.arange(tokens.shape[1], dtype=np.int32)[None]
        out = model(inputs, training=False)
    else:
        out = model(tokens, training=False)
    return np.asarray(out, np.float32)[0]


def _input_names(model):
    inputs = getattr(model.backbone, "input", None)
    return set(inputs) if isinstance(inputs, dict) else set()


def _is_causal_lm(model):
    try:
        import keras_hub
    except ImportError:
        return False
    return isinstance(model, keras_hub.models.CausalLM)


def invented_prompts(vocabulary_size, max_sequence_length, seed=0):
    """Two prompts of random ids (3 and 7 tokens, fewer in a short context)."""
    rng = np.random.default_rng(seed)
    lengths = [min(n, max(1, max_sequence_length // 4)) for n in (3, 7)]
    return [rng.integers(1, vocabulary_size, n).tolist() for n in lengths]


def check_generation(model, content, prompts, *, quantize, invented, half=None):
    """The `GenerationCheck` of the file `content` against `model` on
    `prompts` (`ExportVerificationError` when it fails); `half`: `model` is
    the original computing in that dtype (see the module).

    The file and the model run in turn, never at once: the interpreter's
    XNNPACK-packed weights (a copy per signature) are let go before the
    model's forward passes (a tied head transposes its table per call), so
    the two do not add up in the export's peak."""
    exact = GENERATIVE_MODES[quantize].exact and half is None
    generator = Generator(content)
    news = [min(NEW_TOKENS, generator.max_sequence_length - len(p)) for p in prompts]
    chunks = _prefill_chunks(generator)
    if exact:
        runs = [_greedy(generator, p, n) for p, n in zip(prompts, news, strict=True)]
    del generator
    if not exact:
        sequences = [
            _reference_greedy(model, p, n) for p, n in zip(prompts, news, strict=True)
        ]
        generator = Generator(content)
        runs = [
            (_teacher_forced(generator, p, s[len(p) :]), s)
            for p, s in zip(prompts, sequences, strict=True)
        ]
        del generator
    pairs = []  # (file's rows, reference rows) of every step checked
    for prompt, (got, sequence) in zip(prompts, runs, strict=True):
        ref = reference_logits(model, sequence)[len(prompt) - 1 : len(sequence) - 1]
        pairs.append((got[: len(ref)], ref))
    for ids, got in chunks:
        ref = reference_logits(model, ids)
        if not GENERATIVE_MODES[quantize].exact or len(got) != len(ref):
            got, ref = got[-1:], ref[-1:]
        pairs.append((got, ref))
    errors, agree, steps, sq_err, sq_ref = [], 0, 0, 0.0, 0.0
    for got, ref in pairs:
        scale = np.abs(ref).max()
        errors.append(float(np.abs(got - ref).max() / scale))
        sq_err += float(np.sum((got - ref) ** 2))
        sq_ref += float(np.sum(ref**2))
        agree += int(np.sum(_agrees(got, ref, scale if exact else 0.0)))
        steps += len(ref)
    result = GenerationCheck(
        len(prompts),
        steps,
        invented,
        max(errors),
        agree / steps,
        (sq_err / sq_ref) ** 0.5,
    )
    _judge(result, quantize, half)
    return result


def _prefill_chunks(generator, seed=1):
    """Per prefill signature: a full chunk of random ids from position 0
    and the logits the file returns for it (its last row's, or every
    row's with `prefill_logits="all"`; for a signature returning the
    caches only, one decode step's after it, the id appended)."""
    rng = np.random.default_rng(seed)
    vocabulary = generator.vocabulary_size
    chunks = []
    for length, key in sorted(generator.prefill_lengths.items()):
        ids = rng.integers(1, vocabulary, length).tolist()
        generator.reset()
        got = generator.call_signature(key, ids)
        if got is None:
            # The caches only: read back through one decode step.
            if length == generator.max_sequence_length:
                continue
            ids.append(int(rng.integers(1, vocabulary)))
            got = generator.decode(ids[-1])[None]
        chunks.append((ids, got))
    generator.reset()
    return chunks


def _agrees(got, ref, scale):
    """Per step: the file's argmax is the reference's, or within tolerance of
    it in the reference (a tie in float32)."""
    chosen = np.argmax(got, axis=-1)
    best = ref.max(axis=-1)
    picked = np.take_along_axis(ref, chosen[:, None], axis=-1)[:, 0]
    return (chosen == np.argmax(ref, axis=-1)) | (
        best - picked <= FLOAT32_TOLERANCE * scale
    )


def _greedy(generator, prompt, new):
    rows = [generator.prefill(prompt)[-1]]
    sequence = list(prompt)
    for _ in range(new):
        token = int(np.argmax(rows[-1]))
        sequence.append(token)
        if len(rows) < new:
            rows.append(generator.decode(token))
    return np.stack(rows), sequence


def _reference_greedy(model, prompt, new):
    sequence = list(prompt)
    for _ in range(new):
        sequence.append(int(np.argmax(reference_logits(model, sequence)[-1])))
    return sequence


def _teacher_forced(generator, prompt, continuation):
    rows = [generator.prefill(prompt)[-1]]
    for token in continuation[:-1]:
        rows.append(generator.decode(token))
    return np.stack(rows)


def _judge(result, quantize, half=None):
    mode = GENERATIVE_MODES[quantize]
    where = (
        f"over {result.steps} steps of {result.prompts} "
        + ("invented " if result.invented_prompts else "")
        + "prompts"
    )
    if half is not None:
        tolerance = (mode.tolerance or 0.0) + HALF_RMS_TOLERANCE[half]
        if result.agreement < MIN_AGREEMENT or result.rms_error > tolerance:
            raise ExportVerificationError(
                "The generative file, written from the float32 copy of the "
                f"model, drifts from the {half} model itself {where} "
                f"(teacher-forced on its greedy choices): top-1 agreement "
                f"{result.agreement:.0%} (at least {MIN_AGREEMENT:.0%} "
                f"needed), relative rms error {result.rms_error:.3f} (at most "
                f"{tolerance:.3f}). Nothing was written."
            )
        return
    if mode.exact:
        if result.max_error > FLOAT32_TOLERANCE or result.agreement < 1.0:
            raise ExportVerificationError(
                "The generative file differs from the model's full forward "
                f"pass {where}: max logit error {result.max_error:.2e} of the "
                f"largest logit (tolerance {FLOAT32_TOLERANCE:.0e}), greedy "
                f"agreement {result.agreement:.0%}. Nothing was written."
            )
        return
    tolerance = mode.tolerance
    if result.agreement < mode.min_agreement or result.rms_error > tolerance:
        raise ExportVerificationError(
            f"The {quantize!r} generative file drifts from the model {where} "
            f"(teacher-forced): top-1 agreement {result.agreement:.0%} (at "
            f"least {mode.min_agreement:.0%} needed), relative rms error "
            f"{result.rms_error:.3f} (at most {tolerance}). Export with "
            "quantize=None, or 'float16'. Nothing was written."
        )
