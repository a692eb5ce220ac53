"""On device: kerasnorm's `to_tflite` beside Keras' own LiteRT export, the
recurrent layers in every quantize mode, fast int8 and streaming int8.

    python -m export.bench_ondevice                     # everything, ~15 min
    python -m export.bench_ondevice --quick             # tiny: a smoke test
    python -m export.bench_ondevice --repeats 50 --out /tmp/ondevice

Part 1 (ondevice_pairs.py), side by side. Per model (a small conv net with
GroupNorm, one with LayerNorm, MobileNetV3Small at 96x96 with random
BatchNorm statistics, a DeepNorm encoder of kerasnorm's blocks, and a
LayerNormLSTM and a LayerNormGRU trained on the 8 rows of scikit-learn's
digits), kerasnorm's `to_tflite` against `model.export(path,
format="litert")`, the path Keras documents: whether the file has only
builtin ops (else the Flex ops it needs), op count, size, LiteRT latency at
batch 1 (XNNPACK, one thread), max |file - keras| / max |keras| on held-out
inputs, and the same for int8 (rms error over the logits' rms instead). For
int8 Keras' export gets what its docs say to pass, `optimizations` and a
`representative_dataset` (int8 with float fallback); a recurrent model is
given to both exporters rebuilt with `unroll=True`, since TFLite's int8
calibration crashes on a rolled loop. A failed export is recorded in its
cell and the run goes on. The ops in which the two files differ are listed
below the table: that is where a latency difference comes from. A row is
one `Pair` in `ondevice_pairs.pairs()`, which may give Keras' export a twin
built with Keras' own layers.

Part 2 (ondevice_modes.py), recurrent layers in every quantize mode of
`kerasnorm.export.QUANTIZE_MODES`: test accuracy, rms of (file - keras
logits) over the rms of the keras logits, size, converter time and latency.
The full-integer modes use the rolled model where `to_tflite` unrolls it
itself, else a copy built with `unroll=True` by hand (said in the table).

Part 3 (ondevice_int8.py), int8 against float32 per norm: the full-integer
file (`int8_io=True`) and the fast one `quantize="int8"` writes, with
XNNPACK partitions. Part 4 (ondevice_streaming.py), a streaming
LayerNormLSTM's error against sequence length per mode. Their latency is
thread CPU time, robust on a shared machine.

Latency: every candidate of one table is timed in the same rounds, one
measurement each per round in a rotating order (benchmarks/timing.py), each
measurement a burst of calls long enough for the clock; the figures are
medians over `--repeats` rounds. The machines these ran on are shared:
compare the ratios. The report starts with the machine and the stack
(benchmarks/machine.py).
"""

import argparse
import datetime
import gc
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras

from benchmarks import machine
from export import ondevice_int8
from export import ondevice_modes
from export import ondevice_pairs
from export import ondevice_streaming
from export import tables


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny: a smoke test")
    parser.add_argument(
        "--repeats", type=int, help="latency rounds (default 100, 3 with --quick)"
    )
    parser.add_argument("--out", help="folder for bench_ondevice.json and .md")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 100
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1. Received: {args.repeats}")
    args.calibration, args.check = (8, 8) if args.quick else (200, 64)
    return args


def _each(rows, name, value):
    """Append `value` to `rows`, print it, and free the models it used."""
    rows.append(value)
    print(f"{name}: {value}", flush=True)
    keras.backend.clear_session()
    gc.collect()


def run(args, workdir):
    """The four parts' rows, as the JSON report holds them."""
    trained = ondevice_modes.train_recurrent(args.quick)
    modes = []
    for label, (model, x_train, _, x_test, y_test) in trained.items():
        modes.append(
            ondevice_modes.every_mode(
                label, model, x_train, x_test, y_test, args, workdir
            )
        )
        print(f"{label}: {modes[-1]}", flush=True)
    sides = []
    kept = {k: (v[0], v[1], v[3]) for k, v in trained.items()}
    for pair in ondevice_pairs.pairs(args.quick, kept):
        _each(sides, pair.name, ondevice_pairs.side_by_side(pair, args, workdir))
    fast = []
    for name, build in ondevice_int8.int8_models(args.quick).items():
        _each(fast, name, ondevice_int8.int8_row(name, build, args, workdir))
    streaming = ondevice_streaming.streaming_rows(args, workdir)
    print(f"streaming: {streaming}", flush=True)
    return {
        "side_by_side": sides,
        "modes": modes,
        "fast_int8": fast,
        "streaming_int8": streaming,
    }


def markdown(header, report, seconds):
    streaming = report["streaming_int8"]
    return "\n".join(
        [
            f"# On-device benchmark\n\n{header}\n",
            '## kerasnorm `to_tflite` vs Keras `model.export(format="litert")`\n',
            tables.side_by_side_table(report["side_by_side"]),
            "\n## Recurrent layers in every quantize mode\n",
            tables.modes_table(report["modes"]),
            "\n## int8 against float32 per norm: the full-integer int8 (int8_io) and "
            "the fast int8\n",
            tables.int8_table(report["fast_int8"]),
            "\n## Streaming int8 against sequence length\n",
            f"{streaming['model']}; rms error of the last step's logits.\n",
            tables.streaming_table(streaming),
            f"\n(run took {seconds:.0f} s)",
        ]
    )


def main(argv=None):
    args = parse_args(argv)
    header = (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{args.repeats} latency rounds, batch 1, one thread\n\n"
        f"{machine.header(load_tensorflow=True)}"
    )
    print(header, flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        report = run(args, workdir)
    text = markdown(header, report, time.perf_counter() - start)
    print()
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_ondevice.json"), "w") as f:
            json.dump(
                {"header": header, "machine": machine.info(), **report}, f, indent=1
            )
        with open(os.path.join(args.out, "bench_ondevice.md"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
