"""Prefill and decode tokens per second of `.litertlm` bundles in LiteRT-LM's
engine, measured by the engine itself (`litert_lm.Benchmark`).

    PYTHONPATH=$PWD python -m export.bench_engine /tmp/bundles/*.litertlm \\
        --prefill 128 --decode 64 --rounds 3

Each round runs every bundle once, in turn, each in a child process of
its own (the engine loads the bundle, prefills `--prefill` tokens and
decodes `--decode`, on the CPU with `--threads` threads); the figures are
the medians over the rounds, beside the child's peak resident memory and
the engine's load time. `export/bench_export_memory.py --bundle --keep DIR`
writes the bundles (keras-hub's Gemma3 at the 270M shape, random weights:
the speed is the shape's, whatever the weights).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

_SOURCE = r"""
import json
import sys

import litert_lm


def peak_bytes():
    # This process's own high-water mark: ru_maxrss would also count the
    # parent's resident memory at the fork, which Linux keeps across exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

path, prefill, decode, threads = sys.argv[1], *map(int, sys.argv[2:5])
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
info = litert_lm.Benchmark(
    path,
    backend=litert_lm.Backend.CPU(thread_count=threads),
    prefill_tokens=prefill,
    decode_tokens=decode,
    cache_dir=":nocache",
).run()
print("RESULT " + json.dumps({
    "init_s": info.init_time_in_second,
    "first_token_s": info.time_to_first_token_in_second,
    "prefill_tokens": info.last_prefill_token_count,
    "prefill_tps": info.last_prefill_tokens_per_second,
    "decode_tokens": info.last_decode_token_count,
    "decode_tps": info.last_decode_tokens_per_second,
    "peak_bytes": peak_bytes(),
}), flush=True)
"""
FIELDS = ("prefill_tps", "decode_tps", "init_s", "peak_bytes")


def run_once(path, prefill, decode, threads):
    """One child's figures (a dict), or the child's error as a string."""
    return child_result(_SOURCE, [path, prefill, decode, threads])


def child_result(source, argv):
    """Run `source` in a child Python with `argv`; the JSON it printed on
    its `RESULT ` line, or its exit and last error lines as a string."""
    done = subprocess.run(
        [sys.executable, "-c", source, *map(str, argv)],
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    return f"exit {done.returncode}: {tail}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from benchmarks import machine

    print(machine.header(), flush=True)
    print(
        f"prefill {args.prefill} tokens, decode {args.decode}, "
        f"{args.threads} thread(s), medians of {args.rounds} interleaved rounds",
        flush=True,
    )
    runs = {path: [] for path in args.bundles}
    for _ in range(args.rounds):
        for path in args.bundles:
            result = run_once(path, args.prefill, args.decode, args.threads)
            if isinstance(result, str):
                print(f"{path}: {result}", flush=True)
                return 1
            runs[path].append(result)
            print(
                f"{os.path.basename(path)}: prefill {result['prefill_tps']:.1f}, "
                f"decode {result['decode_tps']:.1f} tok/s, load average "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print("| bundle | MB | prefill tok/s | decode tok/s | load s | peak GiB |")
    print("|---|---|---|---|---|---|")
    for path, results in runs.items():
        median = {k: statistics.median(r[k] for r in results) for k in FIELDS}
        print(
            f"| {os.path.basename(path)} | {os.path.getsize(path) / 1e6:.0f} "
            f"| {median['prefill_tps']:.1f} | {median['decode_tps']:.1f} "
            f"| {median['init_s']:.2f} | {median['peak_bytes'] / 1024**3:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
