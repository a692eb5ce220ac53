"""Memory and time of `to_litert_lm` on large decoder shapes, stage by stage.

    python -m export.bench_export_memory --shape medium
    python -m export.bench_export_memory --shape gemma3-270m --cache 512 \\
        --prefill 128 --quantize int4 --bundle --keep /tmp/bundles

The model: a keras-hub CausalLM, random weights (seed 0), of a shape of
`tests/export/lm_models.py`'s `LM_SHAPES` (`--layers` cuts it).

`--bundle` writes a `.litertlm` (a SentencePiece tokenizer in Gemma's
layout trained on a few sentences, padded to the model's vocabulary),
run once in LiteRT-LM's engine inside the export as users' bundles are;
`--keep DIR` keeps the file (`export/bench_engine.py` times it in the
engine); `--no-engine-check` skips that run (its child process holds the
model's weights again while the export holds the file and the model: on
a 270M model that passes 9 GB together).

The export runs in a child process, which this one watches: the child is
killed once its resident memory passes `--limit-gb` (the machine is
shared; a run that would take it down is stopped). The child measures each
stage's peak resident memory exactly (`/proc/self/clear_refs` resets the
high-water mark `VmHWM` at each stage's start) and reports, beside the wall
time, file size and the float32 weight bytes:

- `peak`: the export's highest resident memory;
- `delta`: that peak less the resident memory before the export (the
  built model and TensorFlow itself), the export's own memory;
- each ratio to the float32 weight bytes.

Stages: `smooth head`, `smooth blocks` and `calibrate` (a quantized
mode's smoothing search and GPTQ's calibration), `trace` (the signatures
traced), `save` (the SavedModel written), `convert` (LiteRT's
converter), `place` (the weights written and quantized), `check` (the
file against the model's forward pass), `report` (the decode step's
partitions and latency), `bundle` (a `.litertlm`), `other` (between).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tests.export.lm_models import LM_SHAPES as SHAPES

GB = 1024**3  # figures are printed in GiB


# --- the child: one export, measured ------------------------------------------


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Stages:
    """Per stage, its peak resident memory (VmHWM reset at each start) and
    time; nested stages count to the outermost."""

    def __init__(self):
        self.peaks, self.times, self.depth, self.started = {}, {}, 0, None
        self.starts = {}  # resident bytes at each stage's first start
        # The export captures fd 2 while it converts: the lines go to a copy.
        self.log = os.fdopen(os.dup(2), "w")

    def _close(self, name):
        peak = _status("VmHWM")
        self.peaks[name] = max(self.peaks.get(name, 0), peak)
        elapsed = time.perf_counter() - self.started
        self.times[name] = self.times.get(name, 0.0) + elapsed
        line = f"  stage {name}: peak {peak / GB:.2f} GiB, {elapsed:.1f} s"
        print(line, file=self.log, flush=True)

    def wrap(self, owner, attribute, name):
        if (function := getattr(owner, attribute, None)) is None:
            return

        def wrapped(*args, **kwargs):
            if self.depth:
                return function(*args, **kwargs)
            self._close("other")
            _reset_peak()
            self.starts.setdefault(name, _status("VmRSS"))
            self.started, self.depth = time.perf_counter(), 1
            try:
                return function(*args, **kwargs)
            finally:
                self._close(name)
                self.depth = 0
                _reset_peak()
                self.started = time.perf_counter()

        setattr(owner, attribute, wrapped)


def _instrument(stages):
    import tensorflow as tf
    from tensorflow.lite.python import lite

    from kerasnorm.export.litert_lm import bundle
    from kerasnorm.export.litert_lm import calibrate
    from kerasnorm.export.litert_lm import export
    from kerasnorm.export.litert_lm import runtime_lora
    from kerasnorm.export.litert_lm import smoothing as smooth
    from kerasnorm.export.litert_lm import write

    stages.wrap(smooth, "smooth_head", "smooth head")
    stages.wrap(smooth, "smooth", "smooth blocks")
    stages.wrap(calibrate, "product_inputs", "calibrate")
    for attribute in ("_function", "_module", "_traced"):
        stages.wrap(write, attribute, "trace")
    stages.wrap(write, "_frozen_with_names", "freeze")
    stages.wrap(tf.saved_model, "save", "save")
    for cls in vars(lite).values():
        if isinstance(cls, type) and "convert" in vars(cls):
            stages.wrap(cls, "convert", "convert")
    stages.wrap(write, "place_weights", "place")
    stages.wrap(write, "quantize_model", "place")
    # The check runs from export or runtime_lora (an adapter fed and not).
    stages.wrap(export, "check_generation", "check")
    stages.wrap(runtime_lora, "check_generation", "check")
    stages.wrap(export, "decode_delegation", "report")
    stages.wrap(export, "decode_ms", "report")
    stages.wrap(bundle, "write_bundle", "bundle")


def _verdicts_kept(verdicts):
    """Random weights give flat logits, whose greedy token a quantized file
    often misses: the check runs in full (its memory counts), its refusal
    is kept and reported instead of stopping the export."""
    from kerasnorm.export.litert_lm import check
    from kerasnorm.export.numerics.errors import ExportVerificationError

    judge = check._judge

    def kept(result, quantize, half=None):
        try:
            judge(result, quantize, half)
        except ExportVerificationError as err:
            verdicts.append(str(err).split(":")[1].split(". ")[0].strip())

    check._judge = kept


def weight_bytes(model):
    """The model's float32 weight bytes (each variable once: a tied table
    counts once)."""
    import math

    tables = {id(getattr(w, "value", w)): w.shape for w in model.weights}
    return sum(4 * math.prod(int(d) for d in shape) for shape in tables.values())


def build(shape, layers=None):
    from tests.export.lm_models import causal_lm

    config = dict(SHAPES[shape])
    family = config.pop("family", "llama")
    if layers is not None:
        config["num_layers"] = layers
    return causal_lm(family, seed=0, **config), {"family": family, **config}


def child(args):
    import gc

    from kerasnorm.export import to_litert_lm

    model, config = build(args.shape, args.layers)
    weights = weight_bytes(model)
    stages = Stages()
    _instrument(stages)
    verdicts = []
    _verdicts_kept(verdicts)
    gc.collect()
    before = _status("VmRSS")
    suffix = ".litertlm" if args.bundle else ".tflite"
    path = os.path.join(args.keep or args.out, f"{args.shape}-{args.quantize}{suffix}")
    if args.no_engine_check:
        from kerasnorm.export.litert_lm import engine

        engine.engine_installed = lambda: False
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    bundle = {}
    if args.bundle:
        from tests.export.lm_models import padded_sentencepiece

        bundle["tokenizer"] = padded_sentencepiece(args.out, config["vocabulary_size"])
    _reset_peak()
    stages.started = time.perf_counter()
    start = time.perf_counter()
    result = to_litert_lm(
        model,
        path,
        max_sequence_length=args.cache,
        prefill_lengths=args.prefill,
        quantize=args.quantize,
        overwrite=True,
        **bundle,
    )
    wall = time.perf_counter() - start
    stages._close("other")
    peak = max(stages.peaks.values())
    report = {
        "shape": args.shape,
        "config": config,
        "quantize": args.quantize,
        "cache": args.cache,
        "prefill": args.prefill,
        "weight_bytes": weights,
        "before_bytes": before,
        "peak_bytes": peak,
        "delta_bytes": peak - before,
        "wall_s": wall,
        "stage_peak_bytes": stages.peaks,
        "stage_s": stages.times,
        "stage_start_bytes": stages.starts,
        "file_bytes": result.size_bytes,
        "agreement": result.check.agreement,
        "file": path,
        "decode_ms": result.decode_ms,
        "refused": verdicts,
        "engine": result.engine,
    }
    print("RESULT " + json.dumps(report), flush=True)


# --- the parent: a watchdog ---------------------------------------------------


def _tree_rss(pid):
    """Resident bytes of `pid` and its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def watched(argv, limit_bytes, poll_s=0.2):
    """Run `argv`, killing it once its tree's resident memory passes
    `limit_bytes`; `(returncode, stdout, highest tree rss seen, killed)`."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    highest, killed = 0, False
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        rss = _tree_rss(proc.pid)
        highest = max(highest, rss)
        if rss > limit_bytes:
            proc.kill()
            killed = True
            break
        time.sleep(poll_s)
    proc.wait()
    reader.join()
    return proc.returncode, "".join(lines), highest, killed


def measure(
    shape,
    *,
    layers=None,
    quantize=None,
    cache=256,
    prefill=(16,),
    limit_gb=8.0,
    bundle=False,
    keep=None,
    engine_check=True,
):
    """The child's report (a dict), or None with a message when killed or
    failed."""
    with tempfile.TemporaryDirectory() as out:
        argv = [
            sys.executable,
            "-m",
            "export.bench_export_memory",
            "--child",
            "--shape",
            shape,
            "--cache",
            str(cache),
            "--out",
            out,
            "--quantize",
            str(quantize),
            "--prefill",
            *[str(t) for t in prefill],
        ]
        if layers is not None:
            argv += ["--layers", str(layers)]
        if bundle:
            argv += ["--bundle"]
        if keep is not None:
            argv += ["--keep", keep]
        if not engine_check:
            argv += ["--no-engine-check"]
        code, text, highest, killed = watched(argv, limit_gb * GB)
    for line in text.splitlines():
        if line.startswith("RESULT "):
            report = json.loads(line[len("RESULT ") :])
            report["watched_bytes"] = highest
            return report
    what = f"killed above {limit_gb} GB" if killed else f"exit {code}"
    print(f"{shape}: {what}; highest resident {highest / GB:.2f} GiB", flush=True)
    return None


def describe(r):
    w = r["weight_bytes"]
    lines = [
        f"{r['shape']} ({r['config']['num_layers']} layers), quantize="
        f"{r['quantize']}, cache {r['cache']}, prefill {r['prefill']}: "
        f"float32 weights {w / GB:.3f} GiB",
        f"  peak {r['peak_bytes'] / GB:.2f} GiB ({r['peak_bytes'] / w:.2f}x), "
        f"export's own (peak - before) {r['delta_bytes'] / GB:.2f} GiB "
        f"({r['delta_bytes'] / w:.2f}x), before {r['before_bytes'] / GB:.2f} GiB; "
        f"wall {r['wall_s']:.0f} s; file {r['file_bytes'] / 1e6:.1f} MB "
        f"({r['file_bytes'] / w:.2f}x); decode {r['decode_ms']:.2f} ms"
        + (f"; the check refused it ({r['refused'][0]})" if r["refused"] else ""),
    ]
    lines.append(
        f"  the watchdog's highest (the export and its children, the engine's "
        f"included): {r['watched_bytes'] / GB:.2f} GiB"
    )
    if r.get("engine"):
        lines.append(f"  {r['engine']}")
    for name, peak in r["stage_peak_bytes"].items():
        lines.append(
            f"    {name:8s} peak {peak / GB:6.2f} GB  {r['stage_s'][name]:6.1f} s"
            f"  (resident at start {r['stage_start_bytes'].get(name, 0) / GB:.2f} GiB)"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="medium")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--quantize", default="None")
    parser.add_argument("--cache", type=int, default=256)
    parser.add_argument("--prefill", type=int, nargs="+", default=[16])
    parser.add_argument("--limit-gb", type=float, default=8.0)
    parser.add_argument("--bundle", action="store_true")
    parser.add_argument("--keep", default=None)
    parser.add_argument("--no-engine-check", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.quantize = None if args.quantize == "None" else args.quantize
    if args.child:
        child(args)
        return 0
    from benchmarks import machine

    print(machine.header(), flush=True)
    report = measure(
        args.shape,
        layers=args.layers,
        quantize=args.quantize,
        cache=args.cache,
        prefill=args.prefill,
        limit_gb=args.limit_gb,
        bundle=args.bundle,
        keep=args.keep,
        engine_check=not args.no_engine_check,
    )
    if report is None:
        return 1
    print(describe(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
