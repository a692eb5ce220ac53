"""What a runtime LoRA adapter costs on a real checkpoint (issue 61):
SmolLM2-135M-Instruct (tests/support/real_models.py) with
`backbone.enable_lora(RANK)` and seeded nonzero B matrices, written as the
merged bundle (`to_litert_lm`'s default) and as the runtime bundle
(`lora="runtime"`) with its adapter file (`write_lora_adapter`).

    PYTHONPATH=$PWD python -m export.real_lora --out /tmp/real_lora \\
        --modes float32 int4 --rank 16 --threads 2 --rounds 3

Per mode (context 512, prefills 32 and 128, the default check): both
bundles' sizes, the adapter file's against its LoRA weights' float32
bytes, and LiteRT-LM's own prefill and decode tokens per second
(`Engine(enable_benchmark=True)`, a session prefilled with `--prefill`
tokens of a fixed paragraph and decoding `--decode` greedily, each run a
child process) for the merged bundle, the runtime bundle with the adapter
and the runtime bundle with no adapter, in interleaved rounds (medians).
Then one ChatML question, greedy, through the engine's conversation API:
the merged bundle's answer, the runtime bundle's with the adapter and
with the zero adapter (`base=True`: the base model, showing the adapter
changes the answer). Minutes per mode; never run in CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

from export.real_chat import write
from tests.support import real_models

B_SCALE = 0.05  # the seeded LoRA B matrices' standard deviation

_SOURCE = r"""
import json
import sys

import litert_lm

path, rank, adapter, mode, arg, threads, decode = sys.argv[1:8]
rank, threads, decode = int(rank), int(threads), int(decode)
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
extra = {"lora_rank_config": litert_lm.LoraRankConfig(lora_rank=rank)} if rank else {}
engine = litert_lm.Engine(
    path,
    backend=litert_lm.Backend.CPU(thread_count=threads),
    cache_dir=":nocache",
    enable_benchmark=True,
    **extra,
)
lora = litert_lm.LoraConfig(lora_path=adapter) if adapter else None
greedy = litert_lm.SamplerConfig(top_k=1)
if mode == "bench":
    session = engine.create_session(
        apply_prompt_template=False, sampler_config=greedy,
        max_output_tokens=decode, lora_config=lora,
    )
    session.run_prefill([arg])
    session.run_decode()
    info = session.get_benchmark_info()
    out = {
        "init_s": info.init_time_in_second,
        "prefill_tokens": info.last_prefill_token_count,
        "prefill_tps": info.last_prefill_tokens_per_second,
        "decode_tokens": info.last_decode_token_count,
        "decode_tps": info.last_decode_tokens_per_second,
    }
    session.close()
else:
    conversation = engine.create_conversation(
        sampler_config=greedy, max_output_tokens=decode, lora_config=lora
    )
    reply = conversation.send_message({"role": "user", "content": arg})
    out = {"answer": "".join(part["text"] for part in reply["content"])}
    conversation.close()
engine.close()
print("RESULT " + json.dumps(out), flush=True)
"""


def child(path, rank, adapter, mode, arg, threads=2, decode=64):
    from export.bench_engine import child_result

    argv = [path, rank, adapter or "", mode, arg, threads, decode]
    result = child_result(_SOURCE, argv)
    if isinstance(result, str):
        raise RuntimeError(f"{path}: {result}")
    return result


def lora_model(rank, seed=0):
    """SmolLM2 with `enable_lora(rank)` and B ~ N(0, B_SCALE), seeded."""
    real = real_models.load("smollm2")
    real.model.backbone.enable_lora(rank)
    rng = np.random.default_rng(seed)
    for weight in real.model.backbone.weights:
        if weight.path.endswith("lora_kernel_b"):
            weight.assign((B_SCALE * rng.normal(size=weight.shape)).astype("float32"))
    return real


def prompt_text(real, count):
    """A fixed paragraph cut to `count` ids (the engine adds none for SmolLM2)."""
    text = " ".join([real_models.PARAGRAPH] * 4)
    ids = real.ids(text, start=False)[:count]
    text = real.tokenizer.detokenize(np.asarray(ids))
    return text.numpy().decode() if hasattr(text, "numpy") else str(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--modes", nargs="+", default=["float32"])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from benchmarks import machine
    from kerasnorm.export import write_lora_adapter

    print(machine.header(), flush=True)
    os.makedirs(args.out, exist_ok=True)
    real = lora_model(args.rank)
    # The adapter (float32 in every mode) and the zero one, at the rank the
    # runtime bundles take (the model's, padded to the engine's).
    adapter_path = os.path.join(args.out, "adapter.tflite")
    zero_path = os.path.join(args.out, "zero.tflite")
    adapter = write_lora_adapter(real.model, adapter_path, overwrite=True)
    write_lora_adapter(real.model, zero_path, base=True, overwrite=True)
    rank = adapter.rank
    print(
        f"adapter: rank {rank}, {adapter.size_bytes} bytes, LoRA weights "
        f"{adapter.lora_bytes} bytes float32: "
        f"{adapter.size_bytes / adapter.lora_bytes:.4f}x",
        flush=True,
    )
    text = str(prompt_text(real, args.prefill))
    question = real_models.QUESTION
    for mode in args.modes:
        merged = os.path.join(args.out, f"merged_{mode}.litertlm")
        runtime = os.path.join(args.out, f"runtime_{mode}.litertlm")
        refused = write(real, mode, merged, args.context) or write(
            real, mode, runtime, args.context, lora="runtime"
        )
        if refused:
            print(f"{mode}: refused by its check: {refused}", flush=True)
            continue
        merged_mb = os.path.getsize(merged) / 1e6
        runtime_mb = os.path.getsize(runtime) / 1e6
        print(
            f"{mode}: merged {merged_mb:.2f} MB, runtime {runtime_mb:.2f} MB "
            f"(+{runtime_mb - merged_mb:.2f} MB)",
            flush=True,
        )
        variants = {
            "merged": (merged, 0, None),
            "runtime + adapter": (runtime, rank, adapter_path),
            "runtime, no adapter": (runtime, rank, None),
        }
        runs = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (path, r, a) in variants.items():
                result = child(path, r, a, "bench", text, args.threads, args.decode)
                runs[name].append(result)
                print(
                    f"  {mode} {name}: prefill {result['prefill_tps']:.1f} "
                    f"({result['prefill_tokens']} tokens), decode "
                    f"{result['decode_tps']:.1f} ({result['decode_tokens']}) tok/s, "
                    f"load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        print(f"| {mode} | prefill tok/s | decode tok/s | prefill x | decode x |")
        print("|---|---|---|---|---|")
        first = None
        for name, results in runs.items():
            med = {
                k: statistics.median(r[k] for r in results)
                for k in ("prefill_tps", "decode_tps")
            }
            first = first or med
            print(
                f"| {name} | {med['prefill_tps']:.1f} | {med['decode_tps']:.1f} "
                f"| {med['prefill_tps'] / first['prefill_tps']:.3f} "
                f"| {med['decode_tps'] / first['decode_tps']:.3f} |",
                flush=True,
            )
        answers = {
            "merged": child(merged, 0, None, "chat", question, decode=40)["answer"],
            "runtime + adapter": child(
                runtime, rank, adapter_path, "chat", question, decode=40
            )["answer"],
            "runtime + zero adapter": child(
                runtime, rank, zero_path, "chat", question, decode=40
            )["answer"],
        }
        for name, answer in answers.items():
            print(f"  {mode} {name}: {answer!r}", flush=True)
        same = answers["merged"] == answers["runtime + adapter"]
        changed = answers["runtime + zero adapter"] != answers["runtime + adapter"]
        print(
            f"{mode}: runtime + adapter answers as merged: {same}; "
            f"the adapter changes the base's answer: {changed}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
