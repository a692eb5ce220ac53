"""A real checkpoint through kerasnorm's `to_litert_lm` and litert-torch's
converter, side by side on the same weights: teacher-forced agreement and
perplexity on a fixed paragraph against the keras-hub float model, file
size, and LiteRT-LM's engine `Benchmark` of both bundles.

    # 1. the same dequantized weights as a Hugging Face folder (kerasnorm's venv)
    PYTHONPATH=$PWD python -m export.bench_real_models --write-hf /tmp/hf/smollm2
    # 2. litert-torch's files (its own venv; export/peers/litert_torch_real.py)
    /tmp/lt-venv/bin/python export/peers/litert_torch_real.py /tmp/hf/smollm2 \\
        /tmp/peer/smollm2 --transpose --quantize none dynamic_int8 \\
        weight_only_int8 dynamic_int4_block32
    # 3. kerasnorm's files, both sides measured, bundles timed in the engine
    PYTHONPATH=$PWD python -m export.bench_real_models --model smollm2 \\
        --peer-dir /tmp/peer/smollm2 --out /tmp/real/smollm2 --engine

`--perturb` does all three on the weights moved off their GGUF grid
(tests/support/real_models.py). Quality is `export/real_quality.py`'s:
the paragraph's first 39 ids through `prefill_128`, then one `decode` per
further id. kerasnorm's files are written as a bundle's are
(`prefill_logits="none"`: the caches only, as litert-torch's), context 512,
prefills 32 and 128; a mode the export's check refuses is written with
its thresholds lowered (`--unchecked`, the default here: the figures are
the point) and marked "refused". The bundles: kerasnorm's by
`to_litert_lm`'s own bundle writer (tokenizer, metadata); litert-torch's
file in a bundle with the same tokenizer and metadata sections. The engine
figures are `export/bench_engine.py`'s (a child per bundle, medians of
interleaved rounds, `--threads` threads). Never run in CI.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

from export import real_quality
from tests.support import real_models

# kerasnorm's mode -> litert-torch's recipe of the same arithmetic.
RECIPES = {
    "float32": "none",
    "dynamic": "dynamic_int8",
    "weight_only_int8": "weight_only_int8",
    "int4": "dynamic_int4_block32",
    "int4_128": "dynamic_int4_block128",
}


class PeerFeeder:
    """Runs a litert-torch generative `.tflite` teacher-forced: its prefills
    return the caches only, so the prompt's last id goes through `decode`;
    its caches may be `[1, L, g, d]` (its default) or transposed, found
    from the input shapes; a `mask` input gets the causal mask."""

    def __init__(self, content, context):
        from kerasnorm.export.litert.runner import interpreter

        self._interp = interpreter(content)
        self._runners = {
            k: self._interp.get_signature_runner(k)
            for k in self._interp.get_signature_list()
        }
        self.context = context
        decode = self._runners["decode"].get_input_details()
        self._caches = {
            n: d["shape"] for n, d in decode.items() if n.startswith("kv_cache")
        }
        self._mask = decode.get("mask")
        self.prefills = {
            int(re.match(r"prefill_(\d+)", k).group(1)): k
            for k in self._runners
            if k.startswith("prefill_")
        }

    def _mask_for(self, positions, details):
        shape = details["shape"]
        mask = np.full(shape, np.finfo(np.float32).min, np.float32)
        for t, p in enumerate(positions):
            mask[..., t, : p + 1] = 0.0
        return mask

    def _run(self, key, tokens, positions):
        feed = dict(self.caches)
        feed["tokens"] = np.asarray(tokens, np.int32)[None]
        feed["input_pos"] = np.asarray(positions, np.int32)
        details = self._runners[key].get_input_details()
        if "mask" in details:
            feed["mask"] = self._mask_for(positions, details["mask"])
        out = self._runners[key](**feed)
        self.caches = {n: out[n] for n in self._caches}
        return out.get("logits")

    def rows(self, ids, prompt):
        """Logits for the steps `export/real_quality.py` scores."""
        self.caches = {n: np.zeros(s, np.float32) for n, s in self._caches.items()}
        head = ids[: prompt - 1]
        length = min(t for t in self.prefills if t >= len(head))
        padded = head + [0] * (length - len(head))
        self._run(self.prefills[length], padded, list(range(length)))
        rows = []
        for position in range(prompt - 1, len(ids) - 1):
            rows.append(self._run("decode", [ids[position]], [position])[0, -1])
        return np.stack(rows)


def peer_file(peer_dir, model, recipe):
    """litert-torch's file of `recipe` in `peer_dir`: the one with transposed
    caches (`--transpose`, the layout LiteRT-LM's engine reads) if written,
    else its default layout's; None if neither."""
    for suffix in ("_transposed", ""):
        path = os.path.join(peer_dir, f"{model}_{recipe}{suffix}.tflite")
        if os.path.exists(path):
            return path
    return None


def peer_quality(real, path, ids, ref, recipe):
    with open(path, "rb") as f:
        content = f.read()
    rows = PeerFeeder(content, 512).rows(ids, real_quality.PROMPT)
    return real_quality.quality(
        real, ids, ref, rows, mode=recipe, size_bytes=len(content)
    )


def _peer_held_out(real, path, held, mode, peer):
    """litert-torch's file at `path` scored on `held` too
    (`real_quality.held_out`), printed beside its paragraph KL."""
    if not held:
        return
    scored = [peer_quality(real, path, ids, ref, peer.mode) for ids, ref in held]
    steps, agreement, nats = real_quality.pooled(scored)
    print(
        f"{mode}: litert-torch on the held-out text: {steps} steps, agreement "
        f"{agreement:.4f}, KL {nats:.4f}; on the paragraph KL {peer.kl:.4f}",
        flush=True,
    )


def kerasnorm_file(real, mode, out, unchecked):
    """Write kerasnorm's `.tflite` (as a bundle's: prefills return the
    caches only) and its `.litertlm`; (tflite path, bundle path, refused?,
    the check)."""
    from kerasnorm.export import ExportVerificationError
    from kerasnorm.export.litert_lm.check import _judge

    quantize, options = {
        "float32": (None, {}),
        "int4_128": ("int4", {"int4_block_size": 128}),
    }.get(mode, (mode, {}))
    path = os.path.join(out, f"kerasnorm_{mode}.tflite")
    refused = None
    note = path + ".refused"  # the check's verdict, beside a kept file
    if os.path.exists(path):
        refused = open(note).read() if os.path.exists(note) else None
        return path, _bundle(real, path), refused, "(kept from an earlier run)"
    try:
        # Written once with the check's thresholds lowered; its figures
        # judged by the thresholds afterwards (a refusal is a finding).
        result = real_quality.export(
            real, path, quantize, unchecked=True, prefill_logits="none", **options
        )
    except ValueError as error:  # e.g. a block size that does not divide
        return None, None, f"not written: {str(error)[:200]}", None
    check = result.check
    try:
        _judge(check, result.quantize)
    except ExportVerificationError as error:
        refused = str(error).split(":")[1].split(". ")[0].strip()[:160]
        with open(note, "w") as f:
            f.write(refused)
        if not unchecked:
            os.remove(path)
            return None, None, refused, check
    return path, _bundle(real, path), refused, check


def _bundle(real, path):
    from kerasnorm.export.litert_lm import bundle

    bundle_path = path[: -len(".tflite")] + ".litertlm"
    if not os.path.exists(bundle_path):
        with open(path, "rb") as f:
            bundle.write_bundle(
                f.read(), bundle_path, model=real.model, max_sequence_length=512
            )
    return bundle_path


def rebundle(kerasnorm_bundle, tflite_path, target):
    """litert-torch's file in a `.litertlm` with the tokenizer and metadata
    sections of kerasnorm's bundle (the same tokens, context, stop ids)."""
    import tempfile

    from litert_lm_builder import litertlm_builder as builder

    from kerasnorm.export.litert_lm import bundle
    from kerasnorm.export.litert_lm.tokenizer import HF_JSON

    sections = bundle.read_bundle(kerasnorm_bundle)
    kind, data = sections["tokenizer"]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = os.path.join(
            tmp, "tokenizer.json" if kind == HF_JSON else "tokenizer.model"
        )
        with open(tokenizer, "wb") as f:
            f.write(data)
        metadata = os.path.join(tmp, "llm_metadata.pb")
        with open(metadata, "wb") as f:
            f.write(sections["metadata"].SerializeToString())
        file = builder.LitertLmFileBuilder()
        file.add_tflite_model(tflite_path, builder.TfLiteModelType.PREFILL_DECODE)
        if kind == HF_JSON:
            file.add_hf_tokenizer(tokenizer)
        else:
            file.add_sentencepiece_tokenizer(tokenizer)
        file.add_llm_metadata(metadata)
        with open(target, "wb") as f:
            file.build(f)


def cell(q, note=None):
    if q is None:
        return note or "—"
    text = (
        f"{q.agreement:.3f} / {q.perplexity_file:.2f} ({q.ratio:.3f}x) "
        f"/ {q.size_mb:.1f}"
    )
    return text + (f" (refused by its check: {note})" if note else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=sorted(real_models.PACKAGES), default="smollm2"
    )
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument(
        "--write-hf", metavar="DIR", help="write the HF folder, then stop"
    )
    parser.add_argument("--modes", nargs="+", default=list(RECIPES))
    parser.add_argument("--peer-dir", default=None)
    parser.add_argument("--out", default="/tmp/real_models_bench")
    parser.add_argument("--checked", action="store_true", help="skip refused modes")
    parser.add_argument("--peer-only", action="store_true", help="litert-torch's side")
    parser.add_argument("--engine", action="store_true", help="time the bundles")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument(
        "--held-out", metavar="FILE", help="also score on chunks of this text"
    )
    parser.add_argument("--held-out-from", default="", metavar="TEXT")
    args = parser.parse_args(argv)
    if args.write_hf:
        real_models.write_hf_checkpoint(args.model, args.write_hf, perturb=args.perturb)
        return 0
    from benchmarks import machine

    print(machine.header(), flush=True)
    os.makedirs(args.out, exist_ok=True)
    real = real_models.load(args.model, perturb=args.perturb)
    ids = real_quality.paragraph(real)
    ref = real_quality.reference(real, ids)
    print(
        f"{args.model}{' (perturbed)' if args.perturb else ''}: {len(ids)} ids, "
        f"{len(ids) - real_quality.PROMPT} scored steps, keras-hub perplexity "
        f"{real_models.perplexity(ref, ids[real_quality.PROMPT :]):.2f}",
        flush=True,
    )
    held = []
    if args.held_out:
        held = real_quality.held_out(real, args.held_out, args.held_out_from)
    rows, bundles = [], []
    for mode in args.modes:
        recipe = RECIPES[mode]
        peer = None
        peer_path = args.peer_dir and peer_file(args.peer_dir, args.model, recipe)
        if peer_path:
            peer = peer_quality(real, peer_path, ids, ref, recipe)
            _peer_held_out(real, peer_path, held, mode, peer)
        path, bundle_path, refused, check = (
            (None, None, "not run (--peer-only)", None)
            if args.peer_only
            else kerasnorm_file(real, mode, args.out, not args.checked)
        )
        ours = None
        if path is not None:
            ours = real_quality.file_quality(real, path, mode=mode, ids=ids, ref=ref)
        rows.append((mode, recipe, peer, ours, refused))
        print(
            f"{mode}: litert-torch {cell(peer)}; kerasnorm {cell(ours, refused)}; "
            f"check {check}",
            flush=True,
        )
        if args.engine and bundle_path and peer_path:
            name = os.path.basename(peer_path)[: -len(".tflite")]
            peer_bundle = os.path.join(args.out, f"litert_torch_{name}.litertlm")
            if not os.path.exists(peer_bundle):
                rebundle(bundle_path, peer_path, peer_bundle)
            bundles += [peer_bundle, bundle_path]
    print(
        "\n| recipe | litert-torch: agreement / perplexity (ratio) / MB "
        "| kerasnorm: agreement / perplexity (ratio) / MB |\n|---|---|---|"
    )
    for mode, recipe, peer, ours, refused in rows:
        print(f"| {mode} / `{recipe}` | {cell(peer)} | {cell(ours, refused)} |")
    sys.stdout.flush()
    if bundles:
        from export import bench_engine

        return bench_engine.main(
            [
                *bundles,
                "--prefill",
                str(args.prefill),
                "--decode",
                str(args.decode),
                "--threads",
                str(args.threads),
                "--rounds",
                str(args.rounds),
            ]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
