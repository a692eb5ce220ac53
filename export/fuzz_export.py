"""Random sequence models through every `to_tflite` mode, each written file
checked by a raw LiteRT run against Keras.

    python -m export.fuzz_export --graphs 300 --seed 0 [--log fuzz.log]

Each graph (`sequence_graph`) is built from the pieces sequence models use:
float frames (one channel or several) or token ids into an `Embedding` with
`mask_zero=True` and padded ends, every kerasnorm norm and Keras'
`LayerNormalization`, `MultiHeadAttention` (the padding mask followed),
`Conv1D` feed-forwards back to one channel, residual adds, `Dense`, global
pooling; its weights as a few training steps leave them
(`_trained_like`). It is exported with `quantize=None`,
`"float16"`, `"dynamic"`, `"int8"` and `"int16x8"`, and each outcome is

- `ok`: a file was written and a raw LiteRT run of it (`ai_edge_litert`'s
  interpreter, no kerasnorm code) matches `model.predict` within the mode's
  tolerance (times `SLACK`), or, for a float file that does not, matches
  the model computed in float64 within that plus `ROUNDING_FACTOR` times
  Keras' own float32 rounding (`judge`; the outcome then carries the
  figures under `"rounding"`, and the summary counts these files);
- `refused`: `to_tflite` raised; the reason is its message's first line;
- `wrong`: a file was written that the raw run finds outside the tolerance;
- `crashed`: the process that called `to_tflite` died.

The exports run in a worker process that this script restarts when it
dies, so a crash is counted, not fatal. The closing lines give the counts
per mode and the refusals grouped by cause.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from export.fuzz_graphs import SAMPLES
from export.fuzz_graphs import sequence_graph

MODES = (None, "float16", "dynamic", "int8", "int16x8")
# The raw run's error against Keras may exceed the verifier's by this factor
# before the file counts as wrong: the two compare the same samples but
# compute the scale of the error in their own ways.
SLACK = 1.5
# What `to_tflite` compares in each mode (docs/guides/export.md): the max
# error for the float files, the rms error for the quantized ones.
CRITERIA = {None: "max", "float16": "max", "dynamic": "rms", "int8": "rms"}
CRITERIA["int16x8"] = "rms"
_ANSWER = "fuzz-export:"


def raw_run(path, x):
    """The file's `serving_default` run by LiteRT's interpreter alone, one
    sample per call (a full-integer file's fixed batch is 1)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    (name, detail), *_ = runner.get_input_details().items()
    (out_name, out_detail), *_ = runner.get_output_details().items()
    outputs = []
    for sample in x:
        value = sample[None]
        scale, zero = detail["quantization"]
        if scale:
            value = np.round(value / scale + zero)
        y = runner(**{name: value.astype(detail["dtype"])})[out_name]
        scale, zero = out_detail["quantization"]
        outputs.append((y.astype("float32") - zero) * scale if scale else y)
    return np.concatenate(outputs)


def errors(got, want):
    """`(max relative, rms relative)` error of `got` against `want`."""
    diff = np.abs(got.astype("float64") - want)
    max_rel = float(diff.max() / max(np.abs(want).max(), 1e-12))
    rms_rel = float(np.sqrt(np.mean(diff**2)) / max(np.sqrt(np.mean(want**2)), 1e-12))
    return max_rel, rms_rel


def judge(mode, got, want, reference):
    """The outcome fields (`status`, `error`, `criterion`, maybe
    `rounding`) of a raw run's outputs `got` against `model.predict`'s
    `want`, in the mode's criterion (`CRITERIA`).

    A float file (max criterion) beyond `SLACK` times the tolerance gets a
    second look, the rule `to_tflite`'s own check applies
    (`Verification.passed`): it is `ok` if its error against the model
    computed in float64 (`reference.exact`) is within `SLACK` times the
    tolerance plus `ROUNDING_FACTOR` times Keras' own float32 rounding
    (`reference.rounding`, the worse of `model.predict` and an eager call
    against float64). Where a model's float32 output is rounding noise,
    e.g. a norm over one channel feeding a norm over time (exactly
    constant, so the next norm divides rounding by the square root of its
    epsilon), Keras itself differs from float64 by that much and so may a
    correct file; a file that computes something else is far outside both
    (on a well-conditioned model the allowance is about 1e-6).
    """
    from kerasnorm.export import DEFAULT_TOLERANCE
    from kerasnorm.export.numerics.metrics import ROUNDING_FACTOR

    max_rel, rms_rel = errors(got, want)
    criterion = CRITERIA[mode]
    error = max_rel if criterion == "max" else rms_rel
    limit = SLACK * DEFAULT_TOLERANCE[mode]
    outcome = {"status": "ok", "error": error, "criterion": criterion}
    if error <= limit:
        return outcome
    outcome["status"] = "wrong"
    if criterion != "max" or reference.exact is None:
        return outcome
    float64_error = errors(got, reference.exact)[0]
    bound = limit + ROUNDING_FACTOR * reference.rounding
    outcome["rounding"] = {
        "float64_error": float64_error,
        "keras_float32_rounding": reference.rounding,
        "bound": bound,
    }
    if float64_error <= bound:
        outcome["status"] = "ok"
    return outcome


class Float64Reference:
    """A model's outputs computed in float64 (`exact`; None if it cannot
    be rebuilt in float64) and its float32 outputs' max relative error
    against them (`rounding`), computed on first use."""

    def __init__(self, model, x, want):
        self._args = (model, x, want)
        self._done = False

    def _compute(self):
        if self._done:
            return
        self._done = True
        from kerasnorm.export.numerics.precision import float64_outputs

        model, x, want = self._args
        try:
            (exact,) = float64_outputs(model, x)
        except Exception:  # a model without a float64 twin: no second look
            self._exact, self._rounding = None, None
            return
        self._exact = np.asarray(exact, "float64")
        called = np.asarray(model(x, training=False), "float64")
        self._rounding = max(
            errors(want, self._exact)[0], errors(called, self._exact)[0]
        )

    @property
    def exact(self):
        self._compute()
        return self._exact

    @property
    def rounding(self):
        self._compute()
        return self._rounding


def export_modes(seed, directory, report, modes=None):
    """Every mode of graph `seed` (or those of `modes`); `report(dict)` is
    called before each export (`"start"`) and with each outcome."""
    from kerasnorm.export import to_tflite

    start = time.time()
    model, x, description = sequence_graph(seed)
    want = model.predict(x, verbose=0).astype("float64")
    reference = Float64Reference(model, x, want)
    for mode in MODES if modes is None else modes:
        report({"seed": seed, "mode": mode, "start": True, "graph": description})
        path = os.path.join(directory, f"g{seed}_{mode}.tflite")
        outcome = {"seed": seed, "mode": mode, "graph": description}
        outcome["t"] = round(time.time() - start, 1)
        try:
            to_tflite(
                model,
                path,
                quantize=mode,
                representative_data=x,
                verify_inputs=x,
                calibration_samples=SAMPLES,
                overwrite=True,
            )
        except Exception as err:  # every refusal is counted by its reason
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            outcome.update(status="refused", reason=f"{type(err).__name__}: {first}")
            report(outcome)
            continue
        outcome.update(judge(mode, raw_run(path, x), want, reference))
        report(outcome)
        os.remove(path)


def _worker(modes=None):
    """Read seeds on stdin, export each graph (in `modes`, default every
    mode), answer one JSON line per event on stdout."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    def report(event):
        print(_ANSWER + json.dumps(event), flush=True)

    with tempfile.TemporaryDirectory(prefix="fuzz-export-") as directory:
        for line in sys.stdin:
            seed = int(line)
            try:
                export_modes(seed, directory, report, modes)
            except Exception as err:  # a graph that cannot be built or run
                report({"seed": seed, "broken": f"{type(err).__name__}: {err}"[:300]})
            report({"seed": seed, "done": True})


class Worker:
    def __init__(self, modes=None):
        modes = [] if modes is None else ["--modes", ",".join(map(str, modes))]
        self.child = subprocess.Popen(
            [sys.executable, "-m", "export.fuzz_export", "--worker", *modes],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )

    def graph(self, seed):
        """The events of graph `seed`; a `crashed` outcome for the mode
        running when the worker died (the worker is then gone)."""
        self.child.stdin.write(f"{seed}\n")
        self.child.stdin.flush()
        started = None
        for line in self.child.stdout:
            if not line.startswith(_ANSWER):
                continue
            event = json.loads(line[len(_ANSWER) :])
            if event.get("done"):
                return
            if event.get("start"):
                started = event
                continue
            yield event
        code = self.child.wait()
        yield {
            "seed": seed,
            "mode": None if started is None else started["mode"],
            "graph": None if started is None else started["graph"],
            "status": "crashed",
            "reason": f"the exporting process died (status {code})",
        }

    def close(self):
        if self.child.poll() is None:
            self.child.stdin.close()
            self.child.wait()


def fuzz(seeds, log=None, modes=None):
    """Run every graph of `seeds` (in `modes`, default every mode); the
    outcomes (dicts)."""
    outcomes = []
    worker = Worker(modes)
    try:
        for seed in seeds:
            for event in worker.graph(seed):
                outcomes.append(event)
                if log is not None:
                    print(json.dumps(event), file=log, flush=True)
                if event.get("status") == "crashed":
                    worker = Worker(modes)
    finally:
        worker.close()
    return outcomes


def cause(reason):
    """A refusal's reason without its numbers and names: its cause."""
    reason = re.sub(r"'[^']*'", "'…'", reason or "")
    return re.sub(r"\d[\d.e+-]*", "N", reason)[:160]


def summary(outcomes):
    """Lines: counts by mode and status, refusals by mode and cause."""
    counts = collections.Counter(
        (str(o.get("mode")), o["status"]) for o in outcomes if "status" in o
    )
    lines = []
    for mode in map(str, MODES):
        row = {s: counts[(mode, s)] for s in ("ok", "refused", "wrong", "crashed")}
        lines.append(f"{mode:>8}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    rounded = collections.defaultdict(list)
    for o in outcomes:
        if o.get("status") == "ok" and "rounding" in o:
            rounded[str(o["mode"])].append(o["seed"])
    for mode, seeds in rounded.items():
        lines.append(
            f"{mode:>8}: ok only within Keras' own float32 rounding x{len(seeds)} "
            f"(seeds {', '.join(map(str, seeds))})"
        )
    broken = sum(1 for o in outcomes if "broken" in o)
    lines.append(f"graphs that could not be built or run in Keras: {broken}")
    causes = collections.Counter(
        (str(o["mode"]), cause(o["reason"]))
        for o in outcomes
        if o.get("status") == "refused"
    )
    for (mode, reason), n in sorted(causes.items(), key=lambda item: -item[1]):
        lines.append(f"refused {mode} x{n}: {reason}")
    refused = [o for o in outcomes if o.get("status") == "refused"]
    unnamed = [o for o in refused if not names_a_layer(o["reason"])]
    lines.append(
        f"refusals naming a layer: {len(refused) - len(unnamed)} of {len(refused)}"
    )
    for o in unnamed:
        lines.append(f"  names none: seed {o['seed']} {o['mode']}: {o['reason'][:200]}")
    return lines


# A message naming a layer: "layer 'x'", "Layer(s) 'x', 'y'", "layer(s) 'x'".
_NAMED_LAYER = re.compile(r"[Ll]ayer(?:\(s\))? '[^']+'")


def names_a_layer(reason):
    """Whether a refusal's message names a layer of the model."""
    return _NAMED_LAYER.search(reason or "") is not None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", help="these seeds (comma-separated) instead of --graphs/--seed"
    )
    parser.add_argument(
        "--modes", help="these modes only (comma-separated; None for float32)"
    )
    parser.add_argument("--log", help="write each outcome as a JSON line here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = None
    if args.modes:
        modes = [None if m == "None" else m for m in args.modes.split(",")]
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            parser.error(f"unknown mode(s) {unknown}: one of {list(MODES)}")
    if args.worker:
        return _worker(modes)
    if args.seeds:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    else:
        seeds = list(range(args.seed, args.seed + args.graphs))
    start = time.time()
    log = open(args.log, "a") if args.log else None
    try:
        outcomes = fuzz(seeds, log, modes)
    finally:
        if log is not None:
            log.close()
    print(f"{len(seeds)} graphs (seeds {seeds[0]}..), {time.time() - start:.0f} s")
    print("\n".join(summary(outcomes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
