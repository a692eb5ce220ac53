"""A real checkpoint's `.litertlm` bundles converse in LiteRT-LM's engine
as keras-hub's greedy `generate()` does (issue 58, item 5).

    PYTHONPATH=$PWD python -m export.real_chat --model smollm2 \\
        --modes float32 dynamic weight_only_int8 int4 --out /tmp/real_chat

For each mode the model is written by `to_litert_lm` as a bundle with the
default check (no hand-picked prompts, no lowered thresholds: a mode the
check refuses is reported as refused). Each fixed question then goes
through the engine's conversation API (`create_conversation`, greedy,
`--tokens` new tokens at most): the engine renders the bundle's chat
template and answers (a pretrained model, Gemma 3 270M, completes
`Question: ... Answer:` through a session instead). Beside it, on the
prompt the engine rendered:

- keras-hub's greedy `generate()` on the float model (the reference);
- the bundle's own `.tflite` run by `kerasnorm.export.litert.Generator`
  (what the file computes, whatever the engine does with it).

A row says whether the engine's answer is the reference's (`same`), else
the word where the two part, and whether the engine answered as the file
does (the engine's correctness, apart from the mode's rounding). All three
see the start token the engine prepends (the bundle's metadata), which
keras-hub 0.32's `generate()` prepends too whatever the preprocessor's
`add_start_token` says. Whether
the rendered prompt is the model's own turn format (`RealModel.chat`) is
said once per model. Minutes per mode; never run in CI.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from tests.support import real_models

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is the largest planet in the solar system?",
    "Who wrote Romeo and Juliet?",
)
QUANTIZE = {
    "float32": None,
    "dynamic": "dynamic",
    "weight_only_int8": "weight_only_int8",
    "int4": "int4",
}


def write(real, mode, path, context, **options):
    """The bundle of `real` in `mode` at `path` (kept if there already),
    `to_litert_lm`'s further `options` given; None, or the check's refusal
    as text."""
    from kerasnorm.export import ExportVerificationError
    from kerasnorm.export import to_litert_lm

    if os.path.exists(path):
        return None
    try:
        result = to_litert_lm(
            real.model,
            path,
            quantize=QUANTIZE[mode],
            max_sequence_length=context,
            prefill_lengths=(32, 128),
            progress=True,
            **options,
        )
    except ExportVerificationError as err:
        return str(err).splitlines()[0]
    check = result.check
    print(
        f"{os.path.basename(path)}: {result.size_bytes / 1e6:.1f} MB, check agreement "
        f"{check.agreement:.3f} on {check.steps} steps ({check.source})",
        flush=True,
    )
    return None


def parted(a: str, b: str):
    """None if `a` and `b` are the same text (spaces at the ends aside),
    else the index of the first word where they part."""
    a, b = a.split(), b.split()
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def converse(real, path, questions, tokens):
    """`[(question, rendered, engine's answer, reference, file's answer)]`
    for the bundle at `path`."""
    import litert_lm

    from kerasnorm.export.litert import Generator
    from kerasnorm.export.litert_lm.bundle import read_bundle

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    engine = litert_lm.Engine(
        path, backend=litert_lm.Backend.CPU(thread_count=2), cache_dir=":nocache"
    )
    turns = []
    try:
        for question in questions:
            if real.instruct:
                rendered, answer = _conversation(engine, question, tokens)
            else:  # a pretrained model completes "Question: ... Answer:"
                rendered = real.question(question)
                session = engine.create_session(
                    apply_prompt_template=False,
                    sampler_config=litert_lm.SamplerConfig(top_k=1),
                    max_output_tokens=tokens,
                )
                session.run_prefill([rendered])
                answer = session.run_decode().texts[0]
                session.close()
            turns.append([question, rendered, answer])
    finally:
        engine.close()
    real.model.compile(sampler="greedy")
    # The start token the engine puts before every prompt (the bundle's
    # metadata); keras-hub 0.32's `generate()` puts the tokenizer's there
    # too, whatever the preprocessor's `add_start_token` says.
    sections = read_bundle(path)
    start = [int(i) for i in sections["metadata"].start_token.token_ids.ids]
    generator = Generator(sections["model"])
    stops = tuple(real.stop_ids)
    for turn in turns:
        ids = start + real.ids(turn[1], start=False)
        out = real.model.generate(
            turn[1], max_length=len(ids) + tokens, strip_prompt=True
        )
        turn.append(str(out))
        generator.reset()
        new = generator.generate(ids, tokens, stop_tokens=stops)
        new = [t for t in new if t not in stops]
        turn.append(str(real.tokenizer.detokenize(np.asarray(new, np.int32))))
    return turns


def _conversation(engine, question, tokens):
    """(the prompt the engine's chat template renders, its greedy answer)
    for one user turn through the conversation API."""
    import litert_lm

    conversation = engine.create_conversation(
        sampler_config=litert_lm.SamplerConfig(top_k=1), max_output_tokens=tokens
    )
    message = {"role": "user", "content": question}
    rendered = conversation.render_message_to_string(message)
    reply = conversation.send_message(message)
    conversation.close()
    return rendered, "".join(part["text"] for part in reply["content"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2", choices=sorted(real_models.PACKAGES)
    )
    parser.add_argument(
        "--modes", nargs="+", default=list(QUANTIZE), choices=list(QUANTIZE)
    )
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("--out", default="/tmp/real_chat")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--context", type=int, default=512)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    real = real_models.load(args.model, perturb=args.perturb)
    tag = f"{args.model}{'_perturbed' if args.perturb else ''}"
    rows, formats = [], set()
    for mode in args.modes:
        path = os.path.join(args.out, f"{tag}_{mode}.litertlm")
        refused = write(real, mode, path, args.context)
        if refused:
            rows.append(f"| {mode} | refused by its check: {refused} | | |")
            continue
        for question, rendered, answer, ref, own in converse(
            real, path, QUESTIONS, args.tokens
        ):
            formats.add(rendered == real.question(question))
            part = parted(answer, ref)
            said = "same" if part is None else f"parts at word {part}"
            engine = "yes" if parted(answer, own) is None else f"no: {own!r}"
            rows.append(
                f"| {mode} | {question} | {answer.strip()!r} ({said}) | {engine} |"
            )
            print(rows[-1], flush=True)
    print(
        f"\n{tag}: the engine's rendered prompt is the model's own turn format: "
        f"{sorted(formats)}"
    )
    print(
        "| mode | question | the engine's answer (against generate()) "
        "| engine = file |\n|---|---|---|---|"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
