"""Generation on device: the cached decode step against what a user without a
cache pays per token, and against litert-torch's generative file.

    python -m export.bench_generation --peer-dir /tmp/peer     # ~15 min
    python -m export.bench_generation --quick                  # a smoke test

The model: keras-hub's `LlamaCausalLM` of a Llama-style configuration
(vocabulary 32000, 4 layers, hidden 256, 4 query heads, 2 key/value heads,
intermediate 768, which int4 blocks of 32 divide; random weights, seed 0).
kerasnorm writes it three ways:

- `to_litert_lm(..., max_sequence_length=C, prefill_lengths=(16, 128))` for
  C = 256 and 512, float32, `"dynamic"`, `"int4"` and `"weight_only_int8"`:
  signatures `prefill_16`, `prefill_128` (their last row's logits, the
  default) and `decode`;
- `to_tflite(..., batch_size=1)` at a fixed length T = 128 and 512, the
  whole-sequence file: without a cache every generated token costs one such
  pass over the whole prefix (`--no-whole`: none; at T = 512 it needed more
  than 24 GB).

The peer, litert-torch's file of the same configuration (its own Llama
decoder, caches 256 and 512, `none`, `dynamic_int8`, `dynamic_int4_block32`
and `weight_only_int8`), is written by
`export/peers/litert_torch_llama.py` in a separate environment (see its
docstring) into `--peer-dir`; its rows are left out when that folder has no
files.

Timing: ai-edge-litert's interpreter, XNNPACK, one thread, every file of one
context in the same rounds (rotating order; benchmarks/timing.py), each
measurement a burst of calls; medians over `--rounds` of the calling
thread's CPU time. A decode call is timed at position context - 1 (a cache
of C rows costs the same at every position: the mask hides the empty rows,
the step computes them all) with the caches passed in and out, as an engine
does. The report starts with the machine; the machines are shared, so
compare ratios measured in one run.

`--quality` adds, per mode, the teacher-forced agreement with Keras and the
perplexity of a small decoder trained on a sequence rule
(`tests.export.lm_models`, width 64), each file written by `to_litert_lm`
with its check: the random-weight model above has no next token worth
agreeing on, so its quantized files are written without the check (its
near-tied logits fail the 90 % rule by chance, which is what the check is
for).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from benchmarks import machine
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from tests.export import lm_models

PREFILLS = (16, 128)
# The context each cache size is timed at, and the whole-sequence length
# compared with it.
CONTEXTS = {256: 128, 512: 512}
PEER_MODES = {
    None: "none",
    "dynamic": "dynamic_int8",
    "int4": "dynamic_int4_block32",
    "weight_only_int8": "weight_only_int8",
}
MODES = (None, "dynamic", "int4", "weight_only_int8")
# Modes `to_tflite` writes a whole-sequence file in.
WHOLE_MODES = (None, "float16", "dynamic")


def llama(size):
    """keras-hub's LlamaCausalLM of `tests.export.lm_models.SIZES[size]`
    ("medium": the configuration above; "quick": the smoke test's)."""
    # Intermediate 768: divisible by int4's blocks of 32 and 128.
    extra = {"intermediate_dim": 768} if size == "medium" else {}
    return lm_models.causal_lm("llama", size, seed=0, **extra)


def _name(mode):
    return "float32" if mode is None else mode


def _write_unchecked(model, path, cache, mode, logits="last"):
    """The generative file without `to_litert_lm`'s check (random weights)."""
    from kerasnorm.export.litert_lm.steps import cached_model
    from kerasnorm.export.litert_lm.write import write_generative

    content = write_generative(
        cached_model(model, cache),
        prefill_lengths=[t for t in PREFILLS if t < cache],
        max_sequence_length=cache,
        quantize=mode,
        prefill_logits=logits,
    )
    with open(path, "wb") as f:
        f.write(content)


def write_kerasnorm(
    model, out, caches, modes, reuse, check=True, whole=True, logits="last"
):
    from kerasnorm.export import to_litert_lm
    from kerasnorm.export import to_tflite

    files = {}
    for mode in modes:
        for cache, context in caches.items():
            path = os.path.join(out, f"kerasnorm_{_name(mode)}_c{cache}.tflite")
            if not (reuse and os.path.exists(path)):
                start = time.perf_counter()
                if check or mode is None:
                    to_litert_lm(
                        model,
                        path,
                        max_sequence_length=cache,
                        prefill_lengths=[t for t in PREFILLS if t < cache],
                        quantize=mode,
                        prefill_logits=logits,
                        overwrite=True,
                    )
                else:
                    _write_unchecked(model, path, cache, mode, logits)
                print(f"  {path}: {time.perf_counter() - start:.0f} s", flush=True)
            files[("kerasnorm", mode, cache)] = path
            if not whole or mode not in WHOLE_MODES:
                continue
            path = os.path.join(out, f"whole_{_name(mode)}_t{context}.tflite")
            if not (reuse and os.path.exists(path)):
                shape = (None, context)
                to_tflite(
                    model,
                    path,
                    batch_size=1,
                    input_signature={"token_ids": shape, "padding_mask": shape},
                    quantize=mode,
                    overwrite=True,
                )
            files[("whole", mode, context)] = path
    return files


def existing(out, caches, modes):
    """The kerasnorm files a `--write-only` run left in `out`."""
    files = {}
    for mode in modes:
        for cache, context in caches.items():
            for key, name in (
                (
                    ("kerasnorm", mode, cache),
                    f"kerasnorm_{_name(mode)}_c{cache}.tflite",
                ),
                (("whole", mode, context), f"whole_{_name(mode)}_t{context}.tflite"),
            ):
                if os.path.exists(os.path.join(out, name)):
                    files[key] = os.path.join(out, name)
    return files


def peer_files(peer_dir, caches, modes):
    files = {}
    for mode in modes:
        for cache in caches:
            path = os.path.join(
                peer_dir or "", f"llama_{PEER_MODES[mode]}_c{cache}.tflite"
            )
            if peer_dir and os.path.exists(path):
                files[("litert-torch", mode, cache)] = path
    return files


def _zeros(detail, rng, vocabulary):
    if detail["dtype"] == np.int32:
        return rng.integers(1, vocabulary, detail["shape"]).astype(np.int32)
    return np.zeros(detail["shape"], detail["dtype"])


def _call(path, key, context, vocabulary):
    """A zero-argument call of signature `key` of the file at `path`."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=1)
    runner = interp.get_signature_runner(key)
    rng = np.random.default_rng(0)
    inputs = {
        n: _zeros(d, rng, vocabulary) for n, d in runner.get_input_details().items()
    }
    if "input_pos" in inputs:
        length = inputs["input_pos"].shape[0]
        first = context - 1 if length == 1 else 0
        inputs["input_pos"] = np.arange(first, first + length, dtype=np.int32)
    if "padding_mask" in inputs:
        inputs["padding_mask"] = np.ones_like(inputs["padding_mask"])
    runner(**inputs)
    return lambda: runner(**inputs)


def _signature(path, prefix_length):
    from ai_edge_litert.interpreter import Interpreter

    keys = Interpreter(model_path=path).get_signature_list()
    for key in (f"prefill_{prefix_length}", "prefill"):
        if key in keys:
            return key
    return None


def time_all(files, caches, modes, vocabulary, rounds):
    rows = []
    for cache, context in caches.items():
        for mode in modes:
            candidates, labels = {}, {}
            whole = files.get(("whole", mode, context))
            if whole:
                candidates["whole"] = burst_timer(
                    _call(whole, "serving_default", context, vocabulary),
                    clock=time.thread_time,
                )
            for exporter in ("kerasnorm", "litert-torch"):
                path = files.get((exporter, mode, cache))
                if path is None:
                    continue
                labels[exporter] = path
                candidates[(exporter, "decode")] = burst_timer(
                    _call(path, "decode", context, vocabulary), clock=time.thread_time
                )
                for t in PREFILLS:
                    key = _signature(path, t)
                    if key and t < cache:
                        candidates[(exporter, t)] = burst_timer(
                            _call(path, key, context, vocabulary),
                            clock=time.thread_time,
                        )
            if not labels:
                continue
            medians = interleaved_medians(candidates, rounds)
            for exporter, path in labels.items():
                rows.append(
                    dict(
                        exporter=exporter,
                        mode=_name(mode),
                        cache=cache,
                        context=context,
                        mb=os.path.getsize(path) / 1e6,
                        decode=medians[(exporter, "decode")] * 1e3,
                        prefill={
                            t: medians.get((exporter, t), np.nan) * 1e3
                            for t in PREFILLS
                        },
                        whole=medians.get("whole", np.nan) * 1e3,
                    )
                )
    return rows


def quality(modes, out):
    """Per mode: teacher-forced top-1 agreement with Keras and perplexity,
    on a decoder trained on the sequence rule."""
    import keras

    from kerasnorm.export import to_litert_lm
    from tests.export import lm_models

    keras.utils.set_random_seed(0)
    model = lm_models.train(lm_models.kerasnorm_decoder(width=64, layers=2), steps=600)
    sequences = lm_models.rule_sequences(16, seed=11)
    rows = []
    for mode in modes:
        path = os.path.join(out, f"trained_{_name(mode)}.tflite")
        to_litert_lm(
            model,
            path,
            max_sequence_length=lm_models.LENGTH,
            prefill_lengths=(4, 8),
            quantize=mode,
            verify_inputs=lm_models.rule_sequences(3, seed=5)[:, :6],
            overwrite=True,
        )
        with open(path, "rb") as f:
            agreement, perplexity = lm_models.teacher_forced(f.read(), model, sequences)
        rows.append(
            dict(
                mode=_name(mode),
                kb=os.path.getsize(path) / 1e3,
                agreement=agreement,
                perplexity=perplexity,
            )
        )
    lines = [
        "| weights | size kB | teacher-forced agreement | perplexity |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['kb']:.0f} | {r['agreement']:.1%} | "
            f"{r['perplexity']:.3f} |"
        )
    return "\n".join(lines)


def table(rows):
    head = (
        "| file | weights | cache | size MB | decode ms/token | "
        + " | ".join(f"prefill_{t} ms" for t in PREFILLS)
        + " | whole-sequence ms/token (T = context) | decode / whole |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        prefill = " | ".join(f"{r['prefill'][t]:.2f}" for t in PREFILLS)
        lines.append(
            f"| {r['exporter']} | {r['mode']} | {r['cache']} (ctx {r['context']}) | "
            f"{r['mb']:.1f} | {r['decode']:.2f} | {prefill} | {r['whole']:.1f} | "
            f"{r['decode'] / r['whole']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/kerasnorm_bench_generation")
    parser.add_argument("--peer-dir", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--reuse", action="store_true", help="keep files already written"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--modes",
        default="float32,dynamic,int4,weight_only_int8",
        help="comma-separated quantize modes (float32 for none)",
    )
    parser.add_argument(
        "--quality",
        action="store_true",
        help="agreement and perplexity of a trained decoder per mode",
    )
    parser.add_argument("--caches", default="256,512", help="of 256,512")
    parser.add_argument("--no-whole", action="store_true", help="no to_tflite files")
    parser.add_argument("--prefill-logits", default="last", help="last, all or none")
    parser.add_argument(
        "--write-only", action="store_true", help="write the files, time nothing"
    )
    parser.add_argument(
        "--time-only", action="store_true", help="time the files --out already holds"
    )
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(machine.header(load_tensorflow=True), flush=True)
    size = "quick" if args.quick else "medium"
    caches = {int(c): CONTEXTS[int(c)] for c in args.caches.split(",")}
    caches = {64: 32} if args.quick else caches
    modes = tuple(
        None if m == "float32" else m for m in args.modes.split(",") if m.strip()
    )
    if args.quality:
        print(quality(modes, args.out), flush=True)
    if args.time_only:
        files = existing(args.out, caches, modes)
    else:
        whole, logits = not args.no_whole, args.prefill_logits
        files = write_kerasnorm(
            llama(size), args.out, caches, modes, args.reuse, False, whole, logits
        )
    if args.write_only:
        return files
    files.update(peer_files(None if args.quick else args.peer_dir, caches, modes))
    rows = time_all(
        files,
        caches,
        modes,
        lm_models.SIZES[size]["vocabulary_size"],
        3 if args.quick else args.rounds,
    )
    print(table(rows))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
