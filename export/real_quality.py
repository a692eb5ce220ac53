"""How well a generative file holds a real checkpoint (SmolLM2-135M-Instruct,
Gemma 3 270M; tests/support/real_models.py): teacher-forced top-1 agreement
with the keras-hub float model and perplexity of both on a fixed English
paragraph, and the file's size.

The paragraph's first `PROMPT` (39) ids go through a prefill signature, then
every further id through `decode`, one step at a time, as a generation would
feed them (teacher-forced: the paragraph's id, not the file's choice). Each
step's logits are compared with the keras-hub model's full forward pass
over the paragraph (no cache): `agreement` is the fraction of steps whose
largest logit is the same token, the perplexities are over the same steps'
next ids.

    python -m export.real_quality --model smollm2 --quantize dynamic
    python -m export.real_quality --model gemma3 --quantize int4 --perturb

(from the repository root, with PYTHONPATH=$PWD)

`to_litert_lm`'s check refuses a quantized file that loses too many greedy
choices on its verification prompts. To measure such a file anyway,
`--unchecked` writes it with the check's thresholds lowered to nothing
(each quantized row of `kerasnorm.export.options.generative_modes`, its
`min_agreement` and `tolerance`, replaced for the call: the check still
runs and its figures are printed; no library option accepts a refused
file for this). `--option NAME=VALUE`
passes any other `to_litert_lm` argument (a Python literal); `--row
NAME=VALUE` replaces a field of the mode's row for the call, a
measurement's knob no library option gives (`--row gptq=False`: rounded to
nearest). Each file's KL divergence from the float model (nats a step)
moves with every logit, where the agreement moves only at near ties.

`--held-out FILE` also scores each file on up to six 1,800-character
pieces of another text (each's first 500 ids; `--held-out-from TEXT`: from
its first occurrence), for more steps than the paragraph's: e.g.
`--held-out /usr/share/common-licenses/GPL-3 --held-out-from Preamble`.
`--perturbation-gap` scores only the `--perturb`ed float model against the
original: how far the perturbation alone moves it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import os
import tempfile
import time

import numpy as np

from tests.support import real_models

PROMPT = 39


@dataclasses.dataclass
class Quality:
    """One file's figures on the paragraph."""

    model: str
    mode: str
    perturbed: bool
    steps: int  # teacher-forced steps scored (the prefill's last row and each decode)
    agreement: float  # top-1 agreement with the keras-hub float model
    perplexity_keras: float
    perplexity_file: float
    size_mb: float  # the file, 1e6 bytes; None: no file (a float model scored)
    kl: float = float("nan")  # mean KL(float model || file) per step, nats
    check: object = None  # to_litert_lm's GenerationCheck, when it wrote the file
    held: list = dataclasses.field(default_factory=list)  # `held_out` texts
    rounding: str = ""  # how its products were rounded (`GenerativeExport.rounding`)
    smoothing: str = ""  # what smoothing did (`GenerativeExport.smoothing`)

    @property
    def ratio(self) -> float:
        return self.perplexity_file / self.perplexity_keras

    def row(self) -> str:
        return (
            f"| {self.model}{' (perturbed)' if self.perturbed else ''} "
            f"| {self.mode} | {self.agreement:.3f} | {self.perplexity_keras:.2f} "
            f"| {self.perplexity_file:.2f} ({self.ratio:.3f}x) | {self.kl:.4f} "
            f"| {'—' if self.size_mb is None else f'{self.size_mb:.1f}'} |"
        )


HEADER = (
    "| model | mode | top-1 agreement | perplexity (keras-hub) "
    "| perplexity (file) | KL (nats) | MB |\n|---|---|---|---|---|---|---|"
)


def paragraph(real) -> list[int]:
    """The paragraph's ids (after the model's start ids)."""
    return real.ids(real_models.PARAGRAPH)


def reference(real, ids) -> np.ndarray:
    """The keras-hub float model's rows for the scored steps: logits at
    positions `PROMPT - 1 .. len(ids) - 2`."""
    return real_models.forward_logits(real, ids)[PROMPT - 1 : -1]


def generator_rows(generator, ids) -> np.ndarray:
    """A `kerasnorm.export.litert.Generator`'s rows for the same steps:
    prefill of the first `PROMPT` ids (its last row), then `decode` of
    each further id but the last."""
    rows = [generator.prefill(ids[:PROMPT])[-1]]
    for token in ids[PROMPT:-1]:
        rows.append(generator.decode(token))
    return np.stack(rows)


def quality(real, ids, ref, rows, *, mode, size_bytes, check=None) -> Quality:
    """The `Quality` of `rows` (a file's logits for the scored steps)
    against `ref` (the float model's)."""
    targets = ids[PROMPT:]
    return Quality(
        model=real.name,
        mode=mode,
        perturbed=real.perturbed,
        steps=len(rows),
        agreement=float(np.mean(rows.argmax(-1) == ref.argmax(-1))),
        perplexity_keras=real_models.perplexity(ref, targets),
        perplexity_file=real_models.perplexity(rows, targets),
        size_mb=None if size_bytes is None else size_bytes / 1e6,
        kl=kl_divergence(ref, rows),
        check=check,
    )


def kl_divergence(ref, rows) -> float:
    """Mean KL divergence of the file's next-token distribution from the
    float model's, per step (nats): unlike the top-1 agreement, it moves
    with every logit, not only where two tokens tie."""
    p = real_models.log_softmax(np.asarray(ref, np.float64))
    q = real_models.log_softmax(np.asarray(rows, np.float64))
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))


def file_quality(real, path, *, mode, ids=None, ref=None, check=None) -> Quality:
    """The `Quality` of the generative `.tflite` at `path` (written by
    `to_litert_lm`), run by `kerasnorm.export.litert.Generator`."""
    from kerasnorm.export import litert

    ids = paragraph(real) if ids is None else ids
    ref = reference(real, ids) if ref is None else ref
    with open(path, "rb") as f:
        content = f.read()
    generator = litert.Generator(content)
    rows = generator_rows(generator, ids)
    del generator
    return quality(
        real, ids, ref, rows, mode=mode, size_bytes=len(content), check=check
    )


@contextlib.contextmanager
def rows_replaced(changes):
    """For the duration, each mode's row of `options.generative_modes`
    named in `changes` (`{mode: {field: value}}`) with those fields
    replaced: a measurement's knob, no library option."""
    from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

    saved = {name: GENERATIVE_MODES[name] for name in changes}
    for name, fields in changes.items():
        GENERATIVE_MODES[name] = dataclasses.replace(saved[name], **fields)
    try:
        yield
    finally:
        GENERATIVE_MODES.update(saved)


def check_thresholds_lowered():
    """`to_litert_lm`'s check with no agreement or rms threshold, for the
    duration: each quantized mode's row (`options.generative_modes`) with
    its `min_agreement` 0 and its `tolerance` infinite; the check still
    measures and reports, and refuses nothing."""
    from kerasnorm.export.options.generative_modes import GENERATIVE_MODES

    lowered = {"min_agreement": 0.0, "tolerance": float("inf")}
    return rows_replaced(
        {name: lowered for name, mode in GENERATIVE_MODES.items() if not mode.exact}
    )


def export(real, path, quantize, *, unchecked=False, **options):
    """`to_litert_lm(real.model, path, max_sequence_length=512,
    prefill_lengths=(32, 128), quantize=quantize, **options)`; its result."""
    from kerasnorm.export import to_litert_lm

    options = {"max_sequence_length": 512, "prefill_lengths": (32, 128)} | options
    with check_thresholds_lowered() if unchecked else contextlib.nullcontext():
        return to_litert_lm(real.model, path, quantize=quantize, **options)


def held_out(real, path, start=""):
    """`[(ids, reference rows)]` of each `held_out_ids` piece: text the
    model's file is also scored on, for more steps than the paragraph's."""
    return [(ids, reference(real, ids)) for ids in held_out_ids(real, path, start)]


def held_out_ids(real, path, start="", chunks=6, size=1800, most=500):
    """Up to `chunks` pieces of `size` characters of the text at `path`
    (its whitespace collapsed, from the first `start`), each's first `most`
    ids."""
    with open(path, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    text = text[text.index(start) :] if start else text
    pieces = [text[i : i + size] for i in range(0, chunks * size, size)]
    return [real.ids(p)[:most] for p in pieces if len(p) == size]


def pooled(qualities) -> tuple:
    """`(steps, agreement, KL)` over several `Quality`s, by their steps."""
    steps = sum(q.steps for q in qualities)
    agreement = sum(q.agreement * q.steps for q in qualities) / steps
    return steps, agreement, sum(q.kl * q.steps for q in qualities) / steps


def measure(real, quantize, *, unchecked=False, ids=None, ref=None, held=(), **options):
    """Export `real` in mode `quantize` to a temporary `.tflite` and return
    its `Quality` (and the seconds the export took); with `held` (`[(ids,
    reference rows)]`, `held_out`), the `Quality` on each in `.held`."""
    ids = paragraph(real) if ids is None else ids
    ref = reference(real, ids) if ref is None else ref
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.tflite")
        start = time.perf_counter()
        result = export(real, path, quantize, unchecked=unchecked, **options)
        seconds = time.perf_counter() - start
        mode = quantize or "float32"
        if options.get("int4_block_size"):
            mode += f" (block {options['int4_block_size']})"
        got = file_quality(real, path, mode=mode, ids=ids, ref=ref, check=result.check)
        got.rounding = result.rounding
        got.smoothing = result.smoothing
        got.held = [file_quality(real, path, mode=mode, ids=i, ref=r) for i, r in held]
        return got, seconds


def _option(text):
    name, _, value = text.partition("=")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=sorted(real_models.PACKAGES), default="smollm2"
    )
    parser.add_argument(
        "--quantize",
        nargs="+",
        default=["none"],
        help="modes: none (float32), float16, dynamic, int4, weight_only_int8",
    )
    parser.add_argument("--int4-block-size", type=int, default=None)
    parser.add_argument(
        "--perturb", action="store_true", help="weights off their GGUF grid"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--unchecked", action="store_true", help="lower the export check's thresholds"
    )
    parser.add_argument("--option", action="append", default=[], type=_option)
    parser.add_argument(
        "--row",
        action="append",
        default=[],
        type=_option,
        help="NAME=VALUE: the mode's row field replaced (e.g. gptq=False)",
    )
    parser.add_argument(
        "--held-out", metavar="FILE", help="also score on chunks of this text"
    )
    parser.add_argument("--held-out-from", default="", metavar="TEXT")
    parser.add_argument(
        "--perturbation-gap",
        action="store_true",
        help="only score the perturbed float model against the original",
    )
    args = parser.parse_args(argv)
    if args.perturbation_gap:
        return perturbation_gap(args.model, args.seed)
    real = real_models.load(args.model, perturb=args.perturb, seed=args.seed)
    ids = paragraph(real)
    ref = reference(real, ids)
    held = []
    if args.held_out:
        held = held_out(real, args.held_out, args.held_out_from)
    print(f"{args.model}: {len(ids)} paragraph ids, {len(ids) - PROMPT} scored steps")
    print(HEADER)
    for quantize in args.quantize:
        options = dict(args.option)
        if args.int4_block_size:
            options["int4_block_size"] = args.int4_block_size
        mode = None if quantize == "none" else quantize
        with rows_replaced({mode: dict(args.row)} if args.row else {}):
            got, seconds = measure(
                real,
                mode,
                unchecked=args.unchecked,
                ids=ids,
                ref=ref,
                held=held,
                **options,
            )
        print(got.row(), f"export {seconds:.0f} s; check: {got.check}", flush=True)
        if got.held:
            steps, agreement, nats = pooled(got.held)
            print(
                f"held-out text: {steps} steps, agreement {agreement:.4f}, "
                f"KL {nats:.4f}",
                flush=True,
            )
        if got.rounding:
            print(got.rounding, flush=True)
        if got.smoothing:
            print(f"smoothing: {got.smoothing}", flush=True)


def perturbation_gap(name, seed=0):
    """How far `--perturb` alone moves the float model: the perturbed
    float model scored against the original on the paragraph (an int4
    file of the perturbed weights is scored against the perturbed model;
    its rounding is noise of the same size, a step's uniform error against
    a quarter step's Gaussian)."""
    original = real_models.load(name)
    ids = paragraph(original)
    ref = reference(original, ids)
    del original
    moved = real_models.load(name, perturb=True, seed=seed)
    rows = reference(moved, ids)
    print(HEADER)
    print(quality(moved, ids, ref, rows, mode="float32", size_bytes=None).row())


if __name__ == "__main__":
    main()
