"""`to_litert_lm`: a decoder LM as a generative `.tflite` (prefill and decode
over per-layer key/value caches), verified against its full forward pass."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from kerasnorm._core.dependencies import require_litert
from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.litert_lm.check import GenerationCheck
from kerasnorm.export.litert_lm.check import check_generation
from kerasnorm.export.litert_lm.check import invented_prompts
from kerasnorm.export.litert_lm.decode_report import decode_delegation
from kerasnorm.export.litert_lm.decode_report import decode_ms
from kerasnorm.export.litert_lm.steps import cached_model
from kerasnorm.export.litert_lm.write import signature_keys
from kerasnorm.export.litert_lm.write import write_generative
from kerasnorm.export.options.formats import LITERT_LM
from kerasnorm.export.pipeline.door import export
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged

# Prefill lengths when none are given: a short prompt pads to 16 tokens, a
# long one is fed 128 at a time (each signature's cost grows with its T).
DEFAULT_PREFILL_LENGTHS = (16, 128)
LITERT_LM_QUANTIZE_MODES = (None, "float16", "dynamic")


@dataclasses.dataclass
class GenerativeExport:
    """What `to_litert_lm` wrote and measured."""

    path: str
    signatures: dict  # signature key -> its token length T
    max_sequence_length: int
    num_layers: int
    cache_shape: tuple  # (1, g, L, d) of layer 0
    quantize: str | None
    size_bytes: int
    op_counts: dict
    check: GenerationCheck
    # How the decode step runs on XNNPACK (`verify.Delegation`), and its
    # median latency in ms on this machine; None where not measured.
    delegation: object = None
    decode_ms: float | None = None


def _prefill_lengths(prefill_lengths, max_sequence_length):
    if prefill_lengths is None:
        lengths = sorted({min(t, max_sequence_length) for t in DEFAULT_PREFILL_LENGTHS})
    else:
        lengths = sorted({int(t) for t in prefill_lengths})
    if not lengths or any(t < 1 or t > max_sequence_length for t in lengths):
        raise ValueError(
            "`prefill_lengths` are the prompt lengths each prefill signature "
            f"takes, from 1 to max_sequence_length={max_sequence_length}. "
            f"Received: prefill_lengths={prefill_lengths!r}"
        )
    return tuple(lengths)


def ready():
    """Before any work (the format row's `ready`): the file is checked by
    generating with LiteRT."""
    require_litert("to_litert_lm")


def checked_options(given):
    """The format row's `checks`: `given` (the declared options of
    `"litert_lm"`, defaults filled in) checked, `prefill_lengths`
    resolved."""
    quantize = given["quantize"]
    if quantize not in LITERT_LM_QUANTIZE_MODES:
        raise ValueError(
            f"to_litert_lm: `quantize` is one of {LITERT_LM_QUANTIZE_MODES}. "
            f"Received: quantize={quantize!r}"
        )
    length = given["max_sequence_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(
            "`max_sequence_length` is the cache length (prompt plus generated "
            "tokens), an integer of at least 2: pass max_sequence_length= "
            f"(--max-sequence-length). Received: max_sequence_length={length!r}"
        )
    lengths = _prefill_lengths(given["prefill_lengths"], length)
    return {**given, "prefill_lengths": lengths}


def _prompts(verify_inputs, cached, max_sequence_length):
    if verify_inputs is None:
        return invented_prompts(cached.vocabulary_size, max_sequence_length), True
    prompts = [np.asarray(p).reshape(-1).astype(int).tolist() for p in verify_inputs]
    for prompt in prompts:
        if not 1 <= len(prompt) < max_sequence_length:
            raise ValueError(
                f"A verify_inputs prompt has {len(prompt)} tokens; a prompt "
                f"needs 1 to max_sequence_length - 1 = {max_sequence_length - 1}"
                " tokens (room for one generated token). Shorten it or export "
                "with a larger max_sequence_length."
            )
    return prompts, False


def to_litert_lm(
    model,
    path: str | os.PathLike,
    *,
    max_sequence_length: int | None = None,
    prefill_lengths=None,
    quantize: str | None = None,
    tokenizer=None,
    verify_inputs=None,
    overwrite: bool = False,
    verbose: bool = False,
) -> GenerativeExport:
    """Write a decoder LM as a generative file LiteRT-LM's engine reads.

    `model` is a keras-hub `CausalLM` (GPT-2, Gemma, Llama) or a functional
    Keras model from token ids `(batch, time)` to logits `(batch, time,
    vocab)` made of an `Embedding`, a position embedding (keras-hub's
    `PositionEmbedding`, or rotary in the blocks), kerasnorm
    `TransformerDecoderBlock`s, norms and a head.

    A `.tflite` path gets the model file: signatures `prefill` (one length)
    or `prefill_<T>` (one per entry of `prefill_lengths`; default
    `(16, 128)`, capped at `max_sequence_length`) and `decode`; inputs
    `tokens` int32 `(1, T)`, `input_pos` int32 `(T,)` and, per layer `i`,
    `kv_cache_k_<i>` / `kv_cache_v_<i>` float32 `(1, kv_heads,
    max_sequence_length, head_dim)` (heads first: LiteRT-LM's engine reads
    the context length from dimension 2); outputs `logits` `(1, T, vocab)`
    and the caches under their input names. The causal mask is made inside from
    `input_pos`. `litert.Generator` runs it.

    Before the file is moved into place, it generates from `verify_inputs`
    (prompts of token ids; two random prompts when None) and is compared
    with the model's full forward pass without a cache: float32 files
    choose the same greedy tokens with every step's logits within 1e-4 of
    the largest; `"float16"` and `"dynamic"` (int8 weights; norms and
    residual adds stay float) files agree on the top-1 token at 90 % of
    teacher-forced steps within their rms tolerance
    (`ExportVerificationError` otherwise).

    Args:
        model: the decoder LM.
        path: `.tflite` (the model file) or `.litertlm` (a LiteRT-LM bundle
            with the tokenizer and metadata; needs a tokenizer).
        max_sequence_length: the cache length L: prompt plus generated
            tokens (required).
        prefill_lengths: the prefill signatures' token counts. Defaults to
            `None`, meaning `(16, 128)` capped at `max_sequence_length`.
        quantize: `None` (float32), `"float16"` or `"dynamic"`. Defaults to
            `None`.
        tokenizer: a SentencePiece model or `tokenizer.json` path, for a
            `.litertlm` (a keras-hub CausalLM's preprocessor's otherwise).
            Defaults to `None`.
        verify_inputs: prompts (sequences of token ids) to check with.
            Defaults to `None` (invented ones, said so in the result).
        overwrite: replace an existing file. Defaults to `False`.
        verbose: show the converter's log. Defaults to `False`.
    """
    return export(
        model,
        path,
        format="litert_lm",
        max_sequence_length=max_sequence_length,
        prefill_lengths=prefill_lengths,
        quantize=quantize,
        tokenizer=tokenizer,
        verify_inputs=verify_inputs,
        overwrite=overwrite,
        verbose=verbose,
    )


def run_litert_lm(model, options, path):
    """The format row's `run`: write the generative file of `model` at
    `path` (checked by the row's `target`), check it by generating, move it
    into place."""
    bundle_file = LITERT_LM.suffix_of(path) == LITERT_LM.suffix
    tokenizer = options.tokenizer
    max_sequence_length = options.max_sequence_length
    quantize = options.quantize
    if bundle_file and tokenizer is None and _preprocessor(model) is None:
        raise ValueError(
            f"to_litert_lm: a `.litertlm` bundle holds a tokenizer, and "
            f"{model.name!r} has no preprocessor to take one from: pass "
            "tokenizer= a SentencePiece model or tokenizer.json path, or "
            "write a `.tflite` path."
        )
    refuse_existing(path, options.overwrite)
    lengths = list(options.prefill_lengths)
    cached = cached_model(model)
    if cached.window is not None and max_sequence_length > cached.window:
        raise ValueError(
            f"to_litert_lm: {model.name!r} attends over a sliding window of "
            f"{cached.window} tokens, which the cached step does not mask: "
            f"export with max_sequence_length <= {cached.window}. Received: "
            f"max_sequence_length={max_sequence_length}"
        )
    prompts, invented = _prompts(options.verify_inputs, cached, max_sequence_length)
    content = write_generative(
        cached,
        prefill_lengths=lengths,
        max_sequence_length=max_sequence_length,
        quantize=quantize,
        verbose=options.verbose,
    )
    check = check_generation(
        model, content, prompts, quantize=quantize, invented=invented
    )
    with staged(path, directory=False, suffix=LITERT_LM.suffix_of(path)) as tmp:
        if bundle_file:
            from kerasnorm.export.litert_lm import bundle

            bundle.write_bundle(
                content,
                tmp,
                model=model,
                tokenizer=tokenizer,
                max_sequence_length=max_sequence_length,
            )
        else:
            with open(tmp, "wb") as f:
                f.write(content)
    g, d = cached.cache_shapes[0]
    return GenerativeExport(
        path=path,
        signatures=signature_keys(lengths),
        max_sequence_length=max_sequence_length,
        num_layers=len(cached.cache_shapes),
        cache_shape=(1, g, max_sequence_length, d),
        quantize=quantize,
        size_bytes=len(content),
        op_counts=op_counts(content),
        check=check,
        delegation=decode_delegation(content),
        decode_ms=decode_ms(content),
    )


def _preprocessor(model):
    return getattr(model, "preprocessor", None)
