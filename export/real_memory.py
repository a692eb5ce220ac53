"""Peak resident memory of `to_litert_lm` on a real checkpoint (Gemma 3 270M
or SmolLM2-135M-Instruct, tests/support/real_models.py), stage by stage,
with `export/bench_export_memory.py`'s instruments (VmHWM reset at each
stage's start).

    PYTHONPATH=$PWD python -m export.real_memory --model gemma3 --quantize None

The model is loaded from its GGUF file first; the export then writes a
`.tflite` (context 512, prefills 32 and 128), the check's
thresholds lowered when `--unchecked` (a refused mode's memory is
measured too). Printed: the float32 weight bytes, the resident memory
before the export (TensorFlow and the loaded model), the export's peak,
each stage's peak and seconds, and the ratios to the weights.
"""

import argparse
import gc
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from export import bench_export_memory as memory
from export import real_quality
from tests.support import real_models

GB = 1024**3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=sorted(real_models.PACKAGES), default="gemma3"
    )
    parser.add_argument("--quantize", default="None")
    parser.add_argument("--unchecked", action="store_true")
    args = parser.parse_args(argv)
    quantize = None if args.quantize == "None" else args.quantize
    from benchmarks import machine

    print(machine.header(), flush=True)
    real = real_models.load(args.model)
    weights = memory.weight_bytes(real.model)
    stages = memory.Stages()
    memory._instrument(stages)
    gc.collect()
    before = memory._status("VmRSS")
    with tempfile.TemporaryDirectory() as tmp:
        memory._reset_peak()
        stages.started = start = time.perf_counter()
        result = real_quality.export(
            real, os.path.join(tmp, "model.tflite"), quantize, unchecked=args.unchecked
        )
        wall = time.perf_counter() - start
        stages._close("other")
    peak = max(stages.peaks.values())
    print(
        f"{args.model} {args.quantize}: float32 weights {weights / GB:.3f} GiB; "
        f"resident before the export {before / GB:.2f} GiB; export peak "
        f"{peak / GB:.2f} GiB ({peak / weights:.2f}x the weights; own "
        f"{(peak - before) / GB:.2f} GiB, {(peak - before) / weights:.2f}x); "
        f"{wall:.0f} s; file {result.size_bytes / 1e6:.1f} MB; agreement "
        f"{result.check.agreement:.3f}"
    )
    for name in sorted(stages.peaks, key=stages.peaks.get, reverse=True):
        print(
            f"  {name}: peak {stages.peaks[name] / GB:.2f} GiB, resident at "
            f"its start {stages.starts.get(name, 0) / GB:.2f} GiB, "
            f"{stages.times.get(name, 0.0):.0f} s"
        )


if __name__ == "__main__":
    main()
