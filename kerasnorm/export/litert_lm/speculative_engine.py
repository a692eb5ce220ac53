"""A speculative-decoding bundle run in LiteRT-LM's engine with and without
its drafter, in a child process (`engine.py`'s reasons): the engine must
generate the same greedy text both ways, and the base model's greedy
tokens. The child loads the bundle with `enable_speculative_decoding=True`
(the engine loads the drafter then, and refuses a bundle it cannot draft
with), tokenizes the prompts and sends their ids; this process sends the
model's greedy continuation of each; the child generates greedily from each
prompt in a session without the drafter and one with it, and reports the
texts, the model's tokens as text, and each session's decode speed. The
drafter's acceptance rate is the engine's own figure, which it logs as it
closes ("MTP Drafter - Success rate: ..."): drafted tokens the base
accepted, over tokens drafted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.numerics.errors import ExportVerificationError

TIMEOUT_S = 600
_ANSWER = "kerasnorm-speculative:"
_RATE = re.compile(r"MTP Drafter - Success rate: ([0-9.eE+-]+)")

_SOURCE = r"""
import json
import sys
import time

import litert_lm

ANSWER = "kerasnorm-speculative:"


def say(value):
    print(ANSWER + json.dumps(value), flush=True)


path, texts, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
litert_lm.set_min_log_severity(litert_lm.LogSeverity.INFO)
try:
    engine = litert_lm.Engine(
        path,
        backend=litert_lm.Backend.CPU(thread_count=1),
        cache_dir=":nocache",
        enable_benchmark=True,
        enable_speculative_decoding=True,
    )
except Exception as err:
    say({"error": f"{type(err).__name__}: {err}"})
    sys.exit(0)
start = engine.bos_token_id
say({"ids": [list(engine.tokenize(t)) for t in texts], "start": start})
tokens = json.loads(sys.stdin.readline())
runs = []
for text, expected in zip(texts, tokens):
    run = {"model": engine.detokenize(expected)}
    for name, speculative in (("plain", False), ("speculative", True)):
        session = engine.create_session(
            apply_prompt_template=False,
            sampler_config=litert_lm.SamplerConfig(top_k=1),
            max_output_tokens=count,
            enable_speculative_decoding=speculative,
        )
        session.run_prefill([text])
        began = time.perf_counter()
        reply = session.run_decode().texts[0]
        seconds = time.perf_counter() - began
        info = session.get_benchmark_info()
        run[name] = {
            "reply": reply,
            "seconds": seconds,
            "tokens": info.last_decode_token_count,
            "tokens_per_second": info.last_decode_tokens_per_second,
        }
        session.close()
    runs.append(run)
say({"runs": runs})
engine.close()
"""


@dataclasses.dataclass
class SpeculativeRun:
    """The engine's greedy replies and speed with and without the drafter,
    and its acceptance rate (None where it logged none)."""

    texts: list
    replies: list
    acceptance: float | None
    plain_tokens_per_second: float
    speculative_tokens_per_second: float
    tokens: int

    def __str__(self):
        rate = "?" if self.acceptance is None else f"{self.acceptance:.2f}"
        return (
            f"ran in LiteRT-LM's engine with and without the drafter: the same "
            f"greedy text from {len(self.texts)} prompts ({self.tokens} tokens), "
            f"acceptance {rate}, decode {self.speculative_tokens_per_second:.1f} "
            f"tokens/s with it, {self.plain_tokens_per_second:.1f} without"
        )


def _answer(process):
    for line in process.stdout:
        if line.startswith(_ANSWER):
            return json.loads(line[len(_ANSWER) :])
    return None


def run_speculative(path, texts, greedy, count, label=None):
    """Run the bundle at `path` in the engine with and without its drafter
    on `texts`; `greedy(ids, count)` is the base model's greedy
    continuation of the ids the engine feeds. `SpeculativeRun`;
    `ExportConversionError` where the engine cannot load or draft with the
    bundle (its message quoted), `ExportVerificationError` where a reply
    differs from the other or from the model's tokens."""
    label = os.fspath(path) if label is None else label
    log = tempfile.TemporaryFile(mode="w+", errors="backslashreplace")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen(
        [sys.executable, "-c", _SOURCE, os.fspath(path), json.dumps(texts), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    try:
        first = _answer(process)
        if first is None or "error" in first:
            process.communicate(timeout=TIMEOUT_S)
            raise ExportConversionError(
                f"LiteRT-LM's engine cannot draft with {label}: "
                f"{(first or {}).get('error', 'its process ended')} (its log: "
                f"{_errors(_read(log))}). The bundle was not written."
            )
        start = [] if first["start"] is None else [int(first["start"])]
        expected = [greedy(start + list(ids), count) for ids in first["ids"]]
        process.stdin.write(json.dumps(expected) + "\n")
        process.stdin.flush()
        second = _answer(process)
        process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ExportConversionError(
            f"LiteRT-LM's engine gave no answer on {label} in {TIMEOUT_S} s."
        ) from err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        err = _read(log)
        log.close()
    if second is None:
        raise ExportConversionError(
            f"LiteRT-LM's engine ended while generating with {label} (its log: "
            f"{_errors(err)}). The bundle was not written."
        )
    return _judged(texts, second["runs"], err, label)


def _judged(texts, runs, log, label):
    for text, run in zip(texts, runs, strict=True):
        plain, drafted = run["plain"]["reply"], run["speculative"]["reply"]
        if plain != drafted or plain.strip() != run["model"].strip():
            raise ExportVerificationError(
                f"LiteRT-LM's engine generates {drafted!r} greedily from "
                f"{text!r} with {label}'s drafter, {plain!r} without it, and "
                f"the base model {run['model']!r}: speculative decoding must "
                "not change greedy tokens. The bundle was not written."
            )
    rates = _RATE.findall(log)
    return SpeculativeRun(
        texts=list(texts),
        replies=[r["plain"]["reply"] for r in runs],
        acceptance=float(rates[-1]) if rates else None,
        plain_tokens_per_second=_speed(runs, "plain"),
        speculative_tokens_per_second=_speed(runs, "speculative"),
        tokens=sum(r["plain"]["tokens"] for r in runs),
    )


def _speed(runs, name):
    # The same text both ways: the plain session's count of its tokens (the
    # engine's benchmark counts a drafting session's decode calls).
    tokens = sum(r["plain"]["tokens"] for r in runs)
    seconds = sum(r[name]["seconds"] for r in runs)
    return tokens / seconds if seconds > 0 else float("nan")


def _read(log):
    log.flush()
    log.seek(0)
    return log.read()


def _errors(text, lines=4):
    kept = [
        line.strip()
        for line in text.splitlines()
        if "RET_CHECK" in line or "rror" in line or line.startswith(("E0000", "F0000"))
    ]
    return " | ".join(kept[-lines:]) or "empty"
