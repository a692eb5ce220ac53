"""`to_litert_lm(base, path, drafter=assistant)`: a Gemma 4 base and its
`Gemma4AssistantCausalLM` drafter as one `.litertlm` bundle LiteRT-LM's
engine decodes speculatively (`Engine(..., enable_speculative_decoding=True)`).

The bundle holds the base (PREFILL_DECODE: prefills, `decode` and `verify`,
fed embeddings), its embedder (EMBEDDER) and per-layer embedder
(PER_LAYER_EMBEDDER), the drafter (MTP_DRAFTER), the tokenizer and the
metadata (`speculative_files`). The files are checked against the two
models (`speculative_check`), then, with `litert-lm-api` installed, the
bundle runs in the engine with and without the drafter: the same greedy
text both ways and the model's, the acceptance rate and both decode speeds
reported (`speculative_engine`). docs/guides/generation.md, "Speculative
decoding".
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from kerasnorm.export.litert_lm.bundle import write_bundle
from kerasnorm.export.litert_lm.check import reference_logits
from kerasnorm.export.litert_lm.engine import engine_installed
from kerasnorm.export.litert_lm.prompts import check_prompts
from kerasnorm.export.litert_lm.speculative_check import check_speculative
from kerasnorm.export.litert_lm.speculative_engine import run_speculative
from kerasnorm.export.litert_lm.speculative_files import write_speculative
from kerasnorm.export.litert_lm.speculative_graph import pair_refusal
from kerasnorm.export.options.formats import LITERT_LM
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged

# The engine's sample prompts, and the tokens it generates from each.
ENGINE_TEXTS = ("Hello, how are you today?", "a")
ENGINE_TOKENS = 16


@dataclasses.dataclass
class SpeculativeExport:
    """What `to_litert_lm(..., drafter=...)` wrote and found."""

    path: str
    signatures: dict  # the base's signatures: key -> tokens
    draft_steps: int
    max_sequence_length: int
    size_bytes: int
    check: object  # `speculative_check.SpeculativeCheck`
    engine_run: object  # `speculative_engine.SpeculativeRun`, or None
    engine: str
    stop_tokens: tuple
    model_type: str

    def __str__(self):
        return (
            f"{self.path}: a speculative bundle ({self.draft_steps} draft "
            f"steps, {self.size_bytes} bytes); {self.check}; {self.engine}"
        )


def speculative_bundle(base, options, path):
    """The format row's run with `drafter=`: refuse, write, check, bundle,
    run in the engine both ways, stage at `path`."""
    drafter = options.drafter
    message = pair_refusal(base, drafter)
    if message is not None:
        raise TypeError(message)
    given = [
        k
        for k in ("quantize", "prefill_logits", "min_agreement", "smooth")
        if getattr(options, k, None) not in (None, False)
    ]
    # A base's LoRA adapters are merged into its weights, as `lora="merge"`.
    given += [k for k in ("lora_rank",) if getattr(options, k, None) is not None]
    given += ["lora"] if getattr(options, "lora", "merge") != "merge" else []
    if given:
        raise ValueError(
            f"to_litert_lm: a bundle with a drafter is written in float32 with "
            f"its base's decode logits and LoRA merged; it takes none of "
            f"{sorted(given)}."
        )
    if LITERT_LM.suffix_of(path) != LITERT_LM.suffix:
        raise ValueError(
            "to_litert_lm: a drafter goes into a `.litertlm` bundle beside its "
            f"base (MTP_DRAFTER). Received: path={os.fspath(path)!r}"
        )
    refuse_existing(path, options.overwrite)

    def say(line):
        if options.progress or options.verbose:
            print(line, flush=True)

    length = options.max_sequence_length
    steps = int(drafter.num_speculative_tokens)
    say(
        f"Tracing {base.name!r} (prefill, decode, verify of {steps + 1}) and "
        f"{drafter.name!r} (the MTP drafter) and converting them."
    )
    files = write_speculative(
        base,
        drafter,
        max_sequence_length=length,
        prefill_lengths=options.prefill_lengths,
        draft_steps=steps,
        verbose=options.verbose,
    )
    vocabulary = int(base.backbone.vocabulary_size)
    prompts, _ = check_prompts(options.verify_inputs, base, vocabulary, length)
    say(f"Verifying: {len(prompts)} prompts against the two models.")
    check = check_speculative(
        base, drafter, files, prompts, max_sequence_length=length, new=4
    )
    sections = [
        ("EMBEDDER", files.embedder),
        ("PER_LAYER_EMBEDDER", files.per_layer_embedder),
        ("MTP_DRAFTER", files.drafter),
    ]
    with staged(path, directory=False, suffix=LITERT_LM.suffix) as tmp:
        say("Bundling the base, its embedders, the drafter and the tokenizer.")
        resolved, chat = write_bundle(
            files.base,
            tmp,
            model=base,
            tokenizer=options.tokenizer,
            max_sequence_length=length,
            start_token=options.start_token,
            stop_tokens=options.stop_tokens,
            chat_template=options.chat_template,
            top_k=options.top_k,
            top_p=options.top_p,
            temperature=options.temperature,
            sections=sections,
            cache_length=files.cache_length,
        )
        run, said = (
            None,
            (
                "not run in LiteRT-LM's engine: litert-lm-api is not installed "
                "(pip install 'kerasnorm[litert_lm]' runs it)"
            ),
        )
        if engine_installed():
            say(
                "Running the bundle in LiteRT-LM's engine with and without the drafter."
            )
            run = run_speculative(
                tmp,
                list(ENGINE_TEXTS),
                base_greedy(base, resolved.stop_tokens, length),
                ENGINE_TOKENS,
                label=os.fspath(path),
            )
            said = str(run)
        size = os.path.getsize(tmp)
    return SpeculativeExport(
        path=os.fspath(path),
        signatures=files.signatures,
        draft_steps=steps,
        max_sequence_length=length,
        size_bytes=size,
        check=check,
        engine_run=run,
        engine=said,
        stop_tokens=tuple(resolved.stop_tokens),
        model_type=chat.model_type,
    )


def base_greedy(base, stop_tokens, length):
    """The base's greedy continuation of `ids` (its full forward pass), up
    to a stop token (not kept), within the context."""

    def greedy(ids, count):
        out = list(ids)
        while len(out) < min(len(ids) + count, length):
            token = int(np.argmax(reference_logits(base, np.array(out, np.int32))[-1]))
            if token in stop_tokens:
                break
            out.append(token)
        return out[len(ids) :]

    return greedy
