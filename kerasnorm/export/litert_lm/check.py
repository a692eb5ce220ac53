"""The generative file checked against the model's full forward pass.

The reference is the Keras model called on the whole sequence without a
cache: a causal model's row `p` depends on tokens `<= p` only, so one call
on the finished sequence gives every step's reference logits.

- float32: the file generates greedily from each prompt (`Generator`); every
  step's logits are within `FLOAT32_TOLERANCE` of the reference's largest
  magnitude, and each chosen token is the reference's argmax (unless the
  reference's top two are closer than that tolerance: a tie either may take).
- quantized files: teacher-forced on the reference's own greedy
  continuation (and on a text prompt's own tokens, from its
  `prompts.TEXT_HEAD`-th on), the fraction of steps whose argmax agrees is
  at least the mode's `min_agreement` (or the export's), and the logits'
  rms error over the reference's rms is at most its `tolerance`
  (`options.generative_modes`, one row per mode). A step where the
  file's choice is a near-tie in the reference (its logit within that
  step's rms logit error of the reference's largest: the quantization
  noise is as large as the gap; the margin at most the mode's rms
  tolerance of the step's rms logit) counts as agreeing, and is counted
  in `near_ties`.
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
from kerasnorm.export.litert_lm.prompts import GIVEN
from kerasnorm.export.litert_lm.prompts import INVENTED
from kerasnorm.export.litert_lm.prompts import NEW_TOKENS
from kerasnorm.export.litert_lm.prompts import TEXT
from kerasnorm.export.litert_lm.prompts import TEXT_HEAD
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


@dataclasses.dataclass
class GenerationCheck:
    """What the check measured, over all prompts."""

    prompts: int
    steps: int
    invented_prompts: bool
    max_error: float  # max |file - reference| / max |reference|, float32
    agreement: float  # fraction of steps whose argmax agrees
    rms_error: float  # rms(file - reference) / rms(reference)
    # `GIVEN`, `TEXT` (`prompts.VERIFY_TEXTS` in the model's tokenizer) or
    # `INVENTED`; the agreeing steps that were near-ties (see the module);
    # the agreement the file had to reach (None: the float32 file's exact
    # check).
    source: str = GIVEN
    near_ties: int = 0
    min_agreement: float | None = None


def checked_min_agreement(agreement, quantize):
    """`to_litert_lm`'s `min_agreement` refused unless None or a fraction
    in (0, 1] with a quantized mode."""
    if agreement is not None and (
        isinstance(agreement, bool)
        or not isinstance(agreement, (int, float))
        or not 0.0 < agreement <= 1.0
    ):
        raise ValueError(
            "to_litert_lm: `min_agreement` is the teacher-forced top-1 "
            "agreement a quantized file must reach, a fraction in (0, 1]. "
            f"Received: min_agreement={agreement!r}"
        )
    if agreement is not None and GENERATIVE_MODES[quantize].exact:
        raise ValueError(
            "to_litert_lm: `min_agreement` sets the agreement a quantized "
            "file must reach; the float32 file (quantize=None) is checked "
            "exactly, token for token. Pass a quantize mode, or no "
            f"min_agreement. Received: min_agreement={agreement!r}"
        )


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


def check_generation(
    model,
    content,
    prompts,
    *,
    quantize,
    invented=False,
    half=None,
    source=None,
    min_agreement=None,
    adapter=None,
):
    """The `GenerationCheck` of the file `content` against `model` on
    `prompts` (`ExportVerificationError` when it fails); `half`: `model` is
    the original computing in that dtype (see the module). `source`: where
    the prompts came from (`GIVEN`, `TEXT`, `INVENTED`; default `INVENTED`
    if `invented` else `GIVEN`); a `TEXT` prompt's own tokens are scored
    too. `min_agreement`: the agreement a quantized file must reach
    (default `MIN_AGREEMENT`). `adapter`: what a file with LiteRT-LM's
    adapter inputs is fed (`Generator`; zeros where None).

    The file and the model run in turn, never at once: the file's
    XNNPACK-packed weights (one copy shared by the signatures,
    `litert.signatures`; a copy per signature on an ai-edge-litert without
    the weight cache) are let go before the model's forward passes (a tied
    head transposes its table per call), so the two do not add up in the
    export's peak. A file whose weights XNNPACK would hold as float32
    (`GenerativeMode.unpacked`) runs on LiteRT's built-in kernels: the same
    graph and float arithmetic, one float32 copy of the weights; its decode
    step runs on XNNPACK in the export's report (`decode_report`)."""
    exact = GENERATIVE_MODES[quantize].exact and half is None
    delegated = not GENERATIVE_MODES[quantize].unpacked
    source = source or (INVENTED if invented else GIVEN)
    head = TEXT_HEAD if source == TEXT else None
    generator = Generator(content, adapter, delegated)
    news = [min(NEW_TOKENS, generator.max_sequence_length - len(p)) for p in prompts]
    chunks = _prefill_chunks(generator)
    if exact:
        runs = [_greedy(generator, p, n) for p, n in zip(prompts, news, strict=True)]
    del generator
    if not exact:
        sequences = [
            _reference_greedy(model, p, n) for p, n in zip(prompts, news, strict=True)
        ]
        generator = Generator(content, adapter, delegated)
        runs = [
            (_teacher_forced(generator, s[: head or len(p)], s[head or len(p) :]), s)
            for p, s in zip(prompts, sequences, strict=True)
        ]
        del generator
    pairs = []  # (file's rows, reference rows) of every step checked
    for prompt, (got, sequence) in zip(prompts, runs, strict=True):
        first = (len(prompt) if exact or head is None else head) - 1
        ref = reference_logits(model, sequence)[first : len(sequence) - 1]
        pairs.append((got[: len(ref)], ref))
    for ids, got in chunks:
        ref = reference_logits(model, ids)
        if not GENERATIVE_MODES[quantize].exact or len(got) != len(ref):
            got, ref = got[-1:], ref[-1:]
        pairs.append((got, ref))
    errors, agree, ties, steps, sq_err, sq_ref = [], 0, 0, 0, 0.0, 0.0
    for got, ref in pairs:
        scale = np.abs(ref).max()
        errors.append(float(np.abs(got - ref).max() / scale))
        sq_err += float(np.sum((got - ref) ** 2))
        sq_ref += float(np.sum(ref**2))
        if exact:
            margin = np.full(len(ref), FLOAT32_TOLERANCE * scale)
        else:
            # The quantization noise of each step: its rms logit error, at
            # most the mode's tolerance of the step's rms logit.
            noise = np.sqrt(np.mean((got - ref) ** 2, axis=-1))
            bound = _tolerance(quantize, half) * np.sqrt(np.mean(ref**2, axis=-1))
            margin = np.minimum(noise, bound)
        agreeing = _agrees(got, ref, margin)
        agree += int(np.sum(agreeing))
        if not exact:
            ties += int(np.sum(agreeing & (got.argmax(-1) != ref.argmax(-1))))
        steps += len(ref)
    if not exact and min_agreement is None:
        mode = GENERATIVE_MODES[quantize]
        min_agreement = MIN_AGREEMENT if mode.exact else mode.min_agreement
    result = GenerationCheck(
        len(prompts),
        steps,
        source == INVENTED,
        max(errors),
        agree / steps,
        (sq_err / sq_ref) ** 0.5,
        source=source,
        near_ties=ties,
        min_agreement=None if exact else min_agreement,
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


def _agrees(got, ref, margin):
    """Per step: the file's argmax is the reference's, or within the step's
    `margin` of it in the reference (a tie: float32's tolerance, or a
    quantized file's noise)."""
    chosen = np.argmax(got, axis=-1)
    best = ref.max(axis=-1)
    picked = np.take_along_axis(ref, chosen[:, None], axis=-1)[:, 0]
    return (chosen == np.argmax(ref, axis=-1)) | (best - picked <= margin)


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


def _tolerance(quantize, half):
    """The relative rms error a file may have."""
    tolerance = GENERATIVE_MODES[quantize].tolerance or 0.0
    return tolerance if half is None else tolerance + HALF_RMS_TOLERANCE[half]


def _judge(result, quantize, half=None):
    mode = GENERATIVE_MODES[quantize]
    where = (
        f"over {result.steps} steps of {result.prompts} "
        + {GIVEN: "", TEXT: "text ", INVENTED: "invented "}[result.source]
        + "prompts"
    )
    if half is not None:
        tolerance = _tolerance(quantize, half)
        if result.agreement < result.min_agreement or result.rms_error > tolerance:
            raise ExportVerificationError(
                "The generative file, written from the float32 copy of the "
                f"model, drifts from the {half} model itself {where} "
                f"(teacher-forced on its greedy choices): top-1 agreement "
                f"{result.agreement:.1%} (at least {result.min_agreement:.1%} "
                f"needed), relative rms error {result.rms_error:.3f} (at most "
                f"{tolerance:.3f}). Nothing was written. " + _levers(result, quantize)
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
    tolerance = _tolerance(quantize, None)
    if result.agreement < result.min_agreement or result.rms_error > tolerance:
        raise ExportVerificationError(
            f"The {quantize!r} generative file drifts from the model {where} "
            f"(teacher-forced): top-1 agreement {result.agreement:.1%} (at "
            f"least {result.min_agreement:.1%} needed; {result.near_ties} "
            "near-ties counted as agreeing), relative rms error "
            f"{result.rms_error:.3f} (at most {tolerance}). Nothing was "
            "written. " + _levers(result, quantize)
        )


def _levers(result, quantize):
    """What a refused file's user can do, every lever named."""
    others = ", ".join(repr(m) for m in GENERATIVE_MODES if m not in (None, quantize))
    if result.source == INVENTED:
        prompts = (
            "these prompts were random ids, on which a real model's logits "
            "are flat and their top two close: pass verify_inputs= prompts of "
            "token ids of real text from the model's tokenizer (--verify-data)"
        )
    else:
        prompts = (
            "check on the text the model will see: verify_inputs= prompts of "
            "token ids from its tokenizer (--verify-data)"
        )
    accepted = np.floor(result.agreement * 100) / 100
    return (
        f"Export another mode (quantize= None, {others}; "
        "'weight_only_int8' keeps float arithmetic), or "
        f"{prompts}, or accept this agreement: min_agreement={accepted:.2f} "
        f"(--min-agreement {accepted:.2f}) writes the file when its "
        "teacher-forced top-1 agreement reaches it and its rms error stays "
        "within the mode's bound."
    )
