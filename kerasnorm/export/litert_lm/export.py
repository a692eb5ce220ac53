"""`to_litert_lm`: a decoder LM as a generative `.tflite` (prefill and decode
over per-layer key/value caches), verified against its full forward pass."""

from __future__ import annotations

import os

from kerasnorm._core.dependencies import require_litert
from kerasnorm.export.litert.runner import op_counts
from kerasnorm.export.litert_lm.calibrate import weights_pass_options
from kerasnorm.export.litert_lm.check import check_generation
from kerasnorm.export.litert_lm.check import checked_min_agreement
from kerasnorm.export.litert_lm.decode_report import decode_delegation
from kerasnorm.export.litert_lm.decode_report import decode_ms
from kerasnorm.export.litert_lm.embedder import embedding_bundle_of
from kerasnorm.export.litert_lm.generative_result import GenerativeExport
from kerasnorm.export.litert_lm.prompts import calibration_prompts
from kerasnorm.export.litert_lm.prompts import check_prompts
from kerasnorm.export.litert_lm.runtime_lora import checked_with_adapter
from kerasnorm.export.litert_lm.runtime_lora import lora_fields
from kerasnorm.export.litert_lm.runtime_lora import merged_unless_runtime
from kerasnorm.export.litert_lm.runtime_lora import runtime_lora_of
from kerasnorm.export.litert_lm.ship import check_bundle_options
from kerasnorm.export.litert_lm.ship import stages
from kerasnorm.export.litert_lm.ship import write_checked_bundle
from kerasnorm.export.litert_lm.smoothing import checked_smooth
from kerasnorm.export.litert_lm.smoothing import smoothed
from kerasnorm.export.litert_lm.speculative import speculative_bundle
from kerasnorm.export.litert_lm.steps import cached_model
from kerasnorm.export.litert_lm.write import PREFILL_LOGITS
from kerasnorm.export.litert_lm.write import signature_keys
from kerasnorm.export.litert_lm.write import write_generative
from kerasnorm.export.numerics import precision
from kerasnorm.export.options.formats import LITERT_LM
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import checked_block
from kerasnorm.export.options.generative_modes import generative_mode_names
from kerasnorm.export.pipeline.door import opened
from kerasnorm.export.prepare.weights import float_copy
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged
from kerasnorm.export.weights.keras_quantized import float_traced
from kerasnorm.export.weights.keras_quantized import keras_quantization

# Default prefill lengths: a short prompt pads to 16, a long one is fed 128s.
DEFAULT_PREFILL_LENGTHS = (16, 128)
FLOAT_MODES = "quantize='int4' or 'dynamic'"  # for Keras' weights it refuses
LITERT_LM_QUANTIZE_MODES = generative_mode_names()  # the table's rows


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
    if quantize not in GENERATIVE_MODES:
        raise ValueError(
            f"to_litert_lm: `quantize` is one of {generative_mode_names()}. "
            f"Received: quantize={quantize!r}"
        )
    if given["prefill_logits"] not in (None, *PREFILL_LOGITS):
        raise ValueError(
            f"to_litert_lm: `prefill_logits` is one of {PREFILL_LOGITS}: "
            "the last row's logits, every row's, or none. Received: "
            f"prefill_logits={given['prefill_logits']!r}"
        )
    checked_min_agreement(given["min_agreement"], quantize)
    checked_smooth(given["smooth"], quantize)
    length = given["max_sequence_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(
            "`max_sequence_length` is the cache length (prompt plus generated "
            "tokens), an integer of at least 2: pass max_sequence_length= "
            f"(--max-sequence-length). Received: max_sequence_length={length!r}"
        )
    lengths = _prefill_lengths(given["prefill_lengths"], length)
    return {
        **given,
        "prefill_lengths": lengths,
        "int4_block_size": checked_block(quantize, given["int4_block_size"]),
    }


def to_litert_lm(
    model,
    path: str | os.PathLike,
    *,
    max_sequence_length: int | None = None,
    prefill_lengths=None,
    prefill_logits: str | None = None,
    quantize: str | None = None,
    int4_block_size: int | None = None,
    tokenizer=None,
    verify_inputs=None,
    min_agreement: float | None = None,
    smooth=None,
    lora: str = "merge",
    lora_rank: int | None = None,
    overwrite: bool = False,
    verbose: bool = False,
    start_token=None,
    stop_tokens=None,
    chat_template=None,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float | None = None,
    progress: bool = False,
    drafter=None,
) -> GenerativeExport:
    """Write a decoder LM as a generative file LiteRT-LM's engine reads.

    `model` is a keras-hub `CausalLM` (GPT-2, Gemma, Llama) or a functional
    Keras model from token ids `(batch, time)` to logits `(batch, time,
    vocab)`: layers and `keras.ops` calls that act on each position alone,
    position embeddings (keras-hub's `PositionEmbedding`,
    `TokenAndPositionEmbedding`, `RotaryEmbedding`), and layers that attend
    causally (kerasnorm `TransformerDecoderBlock`, keras-hub
    `TransformerDecoder`, `MultiHeadAttention(use_causal_mask=True)`, a
    layer with a `cached_step` method: docs/guides/generation.md, "Your
    own decoder"). LoRA adapters are merged into their kernels while the
    file is written; a model held in bfloat16 or float16 is written from
    its float32 copy and checked against both (`rebuilt_from`,
    `original_check`).

    A `.tflite` path gets the model file: signatures `prefill` (one length)
    or `prefill_<T>` (one per entry of `prefill_lengths`; default
    `(16, 128)`, capped at `max_sequence_length`) and `decode`; inputs
    `tokens` int32 `(1, T)`, `input_pos` int32 `(T,)` and, per layer `i`,
    `kv_cache_k_<i>` / `kv_cache_v_<i>` float32 `(1, kv_heads,
    max_sequence_length, head_dim)` (heads first: LiteRT-LM's engine reads
    the context length from dimension 2); outputs `logits` (`decode`'s
    `(1, 1, vocab)`; a prefill's last row `(1, 1, vocab)`, every row's
    `(1, T, vocab)` with `prefill_logits="all"`, none with `"none"`, the
    default in a bundle) and the caches under their input names; the
    causal mask is made from `input_pos`. `litert.Generator` runs it.

    Before the file is moved into place, it generates from `verify_inputs`
    (prompts of token ids; when None, a few English sentences in the
    model's tokenizer, teacher-forced over their own tokens too, or two
    random prompts for a model without one) and is compared with the
    model's full forward pass without a cache: float32 files choose the
    same greedy tokens with every step's logits within 1e-4 of the largest;
    quantized files (weights only: norms, attention and residual adds stay
    float) agree on the top-1 token at 90 % (or `min_agreement`) of
    teacher-forced steps within their mode's rms tolerance, a near-tie
    within the step's quantization noise counting as agreeing
    (`ExportVerificationError` otherwise, naming every way on). Each
    prefill signature is also called once on a full chunk and its rows
    compared.

    A `.litertlm` path gets a LiteRT-LM bundle: the file, the tokenizer (the
    CausalLM preprocessor's by default: a SentencePiece model as it is, a
    byte-pair one as a `tokenizer.json` written from its vocabulary and
    merges) and the metadata that makes it a chat model to LiteRT-LM's
    engine: the model type (Gemma3 `gemma3`, Gemma 4 `gemma4`, Qwen3
    `qwen3`, Qwen 2.5 `qwen2p5`, else `generic_model`), the stop tokens
    with the family's end-of-turn token, the Jinja chat template, whether
    the model calls tools and thinks (Gemma 4: yes, with the fields the
    engine parses calls and thoughts by), the context as
    `max_num_tokens`, and sampler defaults. With `litert-lm-api`
    installed, the bundle runs once in the engine in a child process
    before it is moved into place: it must load, and generate greedily
    what the file does (`result.engine` says so, or that it was not run).

    Args:
        model: the decoder LM.
        path: `.tflite` (the model file) or `.litertlm` (a LiteRT-LM bundle
            with the tokenizer and metadata; needs a tokenizer).
        max_sequence_length: the cache length L: prompt plus generated
            tokens (required).
        prefill_lengths: the prefill signatures' token counts. Defaults to
            `None`, meaning `(16, 128)` capped at `max_sequence_length`.
        prefill_logits: what each prefill signature returns besides the
            caches: `"last"`, the logits of its last row only `(1, 1,
            vocab)` (the head multiplies one row; LiteRT-LM's engine reads
            logits from `decode`), `"all"`, every row's `(1, T, vocab)`
            (for scoring a prompt), or `"none"`, the caches only (as
            litert-torch writes: the last layer's feed-forward and the head
            are not computed). Defaults to `None`: `"none"` in a
            `.litertlm` bundle (the engine reads logits from `decode`
            only), `"last"` in a `.tflite` file.
        quantize: `None` (float32), `"float16"`, `"dynamic"` (int8 weights,
            dynamic-range int8 activations), `"int4"` (block-wise int4
            weights, dynamic-range int8 activations) or `"weight_only_int8"`
            (int8 weights, float32 arithmetic). Defaults to `None`.
        int4_block_size: with `quantize="int4"`, the weights' block along
            the input dimension (one scale per block): 32, 64, 128 or 256; a
            product it does not divide takes the largest smaller one that
            does, or int8 (`int4_fallbacks` lists it). Defaults to `None`,
            meaning 32.
        tokenizer: a SentencePiece model or `tokenizer.json` path, for a
            `.litertlm` (a keras-hub CausalLM's preprocessor's otherwise).
            Defaults to `None`.
        verify_inputs: prompts (sequences of token ids) to check with.
            Defaults to `None`: a few English sentences in the model's own
            tokenizer (a keras-hub CausalLM with a preprocessor), else two
            prompts of random ids; `result.check.source` says which.
        min_agreement: with a quantized mode, the teacher-forced top-1
            agreement with the model (a fraction in (0, 1]) at which the
            file is written: a stated acceptance, e.g. the agreement a
            refusal reported. The rms error bound of the mode still holds.
            Defaults to `None`: the mode's threshold (0.9).
        smooth: with `quantize="dynamic"`, `"weight_only_int8"` or `"int4"`,
            rescale per channel each norm read only by linear products (the
            attention's query, key and value; a gated feed-forward's gate
            and up) and each gated feed-forward's down product (the up
            product's output taking the scale), while the file is written:
            the same function in float, the int8 rounding then meeting
            channels of one range. The strength is searched per site on the
            check's prompts against the mode's product; `result.smoothed`
            lists the sites, `result.smoothing` says what was done or why
            not. `True` searches, a float in [0, 1] sets the strength,
            `False` turns it off. Defaults to `None`: on for `"dynamic"`
            and `"int4"`.
        lora: LoRA `"merge"`d into the weights, or `"runtime"`: LiteRT-LM's
            adapter inputs on the base weights (`write_lora_adapter`).
            Defaults to `"merge"`.
        lora_rank: with `lora="runtime"`, the adapter rank the file takes.
            Defaults to `None`.
        overwrite: replace an existing file. Defaults to `False`.
        verbose: show the converter's log and a line per stage. Defaults to
            `False`.
        start_token: the token (id or text) LiteRT-LM's engine prepends to a
            prompt, overriding the tokenizer's; `False`: none. Defaults to
            `None` (the tokenizer's).
        stop_tokens: the token(s) (ids or texts) that end a generation,
            overriding the tokenizer's end token and the family's
            end-of-turn token. Defaults to `None` (those).
        chat_template: the bundle's Jinja chat template (a string, or a
            file's path) that the engine's conversation API renders messages
            with (a Hugging Face one is written to read the engine's content
            parts: docs/guides/chat.md). Defaults to `None`: the family's
            turn format, or the one whose tokens the tokenizer holds.
        top_k: the engine's default top-k sampling. Defaults to `None` (the
            engine's).
        top_p: the engine's default top-p sampling. Defaults to `None` (the
            engine's).
        temperature: the engine's default sampling temperature. Defaults to
            `None` (the engine's).
        progress: print a line per stage (tracing and converting, verifying,
            bundling, running in LiteRT-LM's engine). Defaults to `False`.
        drafter: a keras-hub `Gemma4AssistantCausalLM` for `model`, bundled
            as its MTP_DRAFTER section (the generation guide's "Speculative
            decoding"). Defaults to `None`.
    """
    if (embedding := embedding_bundle_of(model, path, locals())) is not None:
        return embedding  # a keras-hub TextEmbedder: `to_litert_embedder`
    checked, target = opened(
        LITERT_LM,
        path,
        dict(
            max_sequence_length=max_sequence_length,
            prefill_lengths=prefill_lengths,
            prefill_logits=prefill_logits,
            quantize=quantize,
            int4_block_size=int4_block_size,
            tokenizer=tokenizer,
            verify_inputs=verify_inputs,
            min_agreement=min_agreement,
            smooth=smooth,
            lora=lora,
            lora_rank=lora_rank,
            overwrite=overwrite,
            verbose=verbose,
            start_token=start_token,
            stop_tokens=stop_tokens,
            chat_template=chat_template,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            progress=progress,
            drafter=drafter,
        ),
    )
    return run_litert_lm(model, checked, target)


def run_litert_lm(model, options, path):
    """The format row's `run`: refuse, float copy, write (LoRA merged),
    check by generating, bundle and run in the engine, stage at `path`."""
    if options.drafter is not None:  # `speculative`: a base and its drafter
        return speculative_bundle(model, options, path)
    bundle_file = LITERT_LM.suffix_of(path) == LITERT_LM.suffix
    max_sequence_length = options.max_sequence_length
    quantize = options.quantize
    # A bundle's prefills: the caches only (the engine reads `decode`'s).
    prefill_logits = options.prefill_logits or ("none" if bundle_file else "last")
    say = stages(options)
    check_bundle_options(options, path, bundle_file, model)
    refuse_existing(path, options.overwrite)
    lengths = list(options.prefill_lengths)
    rebuild = float_copy(model)
    generating = model if rebuild is None else rebuild.copy
    lora = runtime_lora_of(model, generating, options)  # None: merged
    # Keras' quantized weights: traced in float, written in their mode.
    keras_mode = keras_quantization(model, "to_litert_lm", FLOAT_MODES)
    if keras_mode is not None and quantize is None:
        quantize = keras_mode
    say(
        f"Tracing {model.name!r} and converting it to a generative .tflite "
        f"(prefill {', '.join(map(str, lengths))}, decode; context "
        f"{max_sequence_length})"
        + ("" if quantize is None else f", quantizing to {quantize}")
        + "."
    )
    with (
        merged_unless_runtime(generating, lora) as merged,
        float_traced(generating, "to_litert_lm", FLOAT_MODES) as known,
    ):
        cached = cached_model(generating, max_sequence_length)
        vocabulary = cached.vocabulary_size
        prompts, source = check_prompts(
            options.verify_inputs, model, vocabulary, max_sequence_length
        )
        fit = calibration_prompts(
            prompts, source, model, vocabulary, max_sequence_length
        )
        with smoothed(
            generating,
            fit,
            quantize,
            options.smooth if lora is None else False,
            max_sequence_length,
            keras_quantized=keras_mode is not None,
        ) as smoothing:
            given = (options.int4_block_size, known, fit, source)
            weights_pass = weights_pass_options(generating, quantize, *given)
            content = write_generative(
                cached,
                prefill_lengths=lengths,
                max_sequence_length=max_sequence_length,
                quantize=quantize,
                prefill_logits=prefill_logits,
                variables=generating.weights,
                verbose=options.verbose,
                lora=lora,
                **weights_pass,
            )
    say(f"Verifying: generating from {len(prompts)} prompts against the model.")
    # Against the model as it computes (LoRA adapters on), or its float32
    # copy, then the half-precision model itself.
    judged = dict(quantize=quantize, source=source, min_agreement=options.min_agreement)
    check, base_check = checked_with_adapter(generating, content, prompts, lora, judged)
    written = {}
    original_check = None
    if rebuild is not None:
        half = precision.compute_dtype(model)
        original_check = check_generation(model, content, prompts, **judged, half=half)
    with staged(path, directory=False, suffix=LITERT_LM.suffix_of(path)) as tmp:
        if bundle_file:
            written = write_checked_bundle(
                model, options, content, tmp, path, say, lora
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
        prefill_logits=prefill_logits,
        size_bytes=len(content),
        op_counts=op_counts(content),
        check=check,
        delegation=decode_delegation(content),
        decode_ms=decode_ms(content),
        **written,
        rebuilt_from=None if rebuild is None else rebuild.policy,
        original_check=original_check,
        merged_lora=tuple(merged),
        **lora_fields(lora, base_check),
        int4_fallbacks=tuple(weights_pass["fallbacks"]),
        gptq=tuple(getattr(weights_pass["calibration"], "rounded", ())),
        smoothed=smoothing.smoothed,
        smoothing=smoothing.said,
    )
