"""float32 `.tflite` files of kerasnorm's norms against Keras' export of the
same models built with Keras' norm layers, and what the affine fold adds.

    python -m export.bench_twins                  # ~4 min
    python -m export.bench_twins --rounds 5       # a smoke run
    python -m export.bench_twins --small          # the small nets only, ~2 min
    python -m export.bench_twins --convnext       # + ConvNeXtTiny, ~3 min

The rows are bench_ondevice.py's "vs Keras" pairs (`ondevice_pairs`: a conv
net with GroupNorm, LayerNorm or RMSNorm, a token MLP with LayerNorm or
RMSNorm; the norms' gains in [0.5, 1.5] and offsets ~ N(0, 0.2), since the
converter drops a gain of ones), the same twins at a wider size
(`ondevice_pairs.wide_twin_pairs`: three Conv2D(64, 3) on 32 x 32 x 16, four
token MLP blocks of 64 x 128; not with `--small`), and with `--convnext`
`keras.applications`' ConvNeXtTiny (Keras' `LayerNormalization` before
each block's `Dense`; its Keras file is of the same model). Per row, three
files of one model and its twin (same weights), each at its exporter's
default dynamic batch:

- `keras`: `model.export(path, format="litert")` of the Keras-layer twin;
- `fold=False`: kerasnorm's `to_tflite` without the fold (the norms' float32
  graph, affines included: what the file was before the affine fold);
- `kerasnorm`: `to_tflite`'s default file (the affines folded where exact,
  docs/design.md §4).

Latency: LiteRT with XNNPACK on one thread, each file resized once to batch
1 and then only `invoke`d (what an app that keeps its shape does), in the
calling thread's CPU time, which other jobs of a shared machine do not
inflate; the three files of a row are timed in the same rounds, one burst
each per round in a rotating order, and the figures are medians over
`--rounds` rounds. Max error: max |file - Keras model| / max |Keras model|
over 8 inputs, each file against its own Keras model.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from ai_edge_litert.interpreter import Interpreter

from benchmarks import machine
from benchmarks.timing import burst_timer
from benchmarks.timing import interleaved_medians
from export import files
from export import models
from export import ondevice_pairs
from kerasnorm.export import litert
from kerasnorm.export import to_tflite

FILES = ("keras", "fold=False", "kerasnorm")


def _export(pair, workdir, x):
    """`{file: (bytes, model it must match)}` of one twin pair."""
    model, twin = pair.models()
    out = {"keras": (files.keras_export(twin, f"{workdir}/k.tflite", None, x)[0], twin)}
    for name, fold in (("fold=False", False), ("kerasnorm", True)):
        path = f"{workdir}/{name}.tflite"
        to_tflite(model, path, fold=fold, verify_inputs=x, overwrite=True)
        out[name] = (files.read(path), model)
    return out


def _convnext():
    """ConvNeXtTiny at 64x64 with random norm weights, against Keras' export
    of the same model."""
    rng = np.random.default_rng(2)

    def build():
        model = keras.applications.ConvNeXtTiny(
            weights=None, input_shape=(64, 64, 3), classifier_activation=None
        )
        models.randomize_norms(model)
        return model

    return ondevice_pairs.Pair(
        "ConvNeXtTiny 64x64 (same model)",
        build,
        lambda n: rng.uniform(0, 255, (n, 64, 64, 3)).astype("float32"),
    )


def _invoker(content, x):
    """A zero-argument `invoke` of `content` at batch 1 on `x[:1]`, and the
    file's outputs on each sample of `x`."""
    interpreter = Interpreter(model_content=content, num_threads=1)
    (entry,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(entry["index"], (1, *x.shape[1:]))
    interpreter.allocate_tensors()
    output = interpreter.get_output_details()[0]["index"]
    outputs = []
    for sample in x:
        interpreter.set_tensor(entry["index"], sample[None])
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(output)[0])
    interpreter.set_tensor(entry["index"], x[:1])
    return interpreter.invoke, np.stack(outputs)


def row(pair, rounds, workdir):
    """Per file: ms per call, max error, `MUL` count."""
    x = pair.data(8)
    exported = _export(pair, workdir, x)
    timers, cells = {}, {}
    for name, (content, model) in exported.items():
        invoke, got = _invoker(content, x)
        want = np.asarray(model.predict(x, verbose=0))
        timers[name] = burst_timer(invoke, clock=time.thread_time)
        cells[name] = {
            "max_rel": float(np.abs(got - want).max() / np.abs(want).max()),
            "mul": litert.op_counts(content).get("MUL", 0),
        }
    for name, seconds in interleaved_medians(timers, rounds).items():
        cells[name]["ms"] = 1e3 * seconds
    return cells


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=61)
    parser.add_argument(
        "--convnext",
        action="store_true",
        help="also keras.applications.ConvNeXtTiny at 64x64 (its Keras "
        "LayerNormalization -> Dense blocks; no twin: Keras' export of the "
        "same model), about 1 min more",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="the small nets only, not the wide ones (wide_twin_pairs)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: {args.rounds}")
    print(f"{args.rounds} rounds, batch 1, one thread, thread CPU time")
    print(machine.header(load_tensorflow=True), flush=True)
    twins = [p for p in ondevice_pairs.pairs(False, {}) if p.keras_build is not None]
    if not args.small:
        twins += ondevice_pairs.wide_twin_pairs()
    if args.convnext:
        twins.append(_convnext())
    head = "model".ljust(52) + "".join(f"{name:>18}" for name in FILES)
    print(f"\n{head}   / keras (fold=False, kerasnorm)   MULs   max error")
    with tempfile.TemporaryDirectory() as workdir:
        for pair in twins:
            cells = row(pair, args.rounds, workdir)
            ms = [cells[name]["ms"] for name in FILES]
            ratios = f"{ms[1] / ms[0]:.3f}, {ms[2] / ms[0]:.3f}"
            muls = "/".join(str(cells[name]["mul"]) for name in FILES)
            error = max(cells[name]["max_rel"] for name in FILES)
            timings = "".join(f"{value * 1e3:15.2f} us" for value in ms)
            print(
                f"{pair.name:52s}{timings}   {ratios:>28s}   {muls:>6s}   {error:.1e}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
