"""Does `litert-quantizer` serve kerasnorm's generative files? Weight-only
int8 and int4 (channel-wise and block-wise) of a `to_litert_lm` `.tflite`.

Run it where litert-quantizer is installed (it pins ai-edge-litert exactly,
so kerasnorm does not depend on it; see export/README.md):

    python3.11 -m venv /tmp/quantizer_venv
    /tmp/quantizer_venv/bin/pip install litert-quantizer
    /tmp/quantizer_venv/bin/python export/peers/litert_quantizer_eval.py \\
        /tmp/kerasnorm_bench_generation/kerasnorm_float32_c256.tflite

For each recipe: the file size, the decode step's median time (one thread,
interleaved rounds) and, teacher-forced over 64 random tokens fed through
`decode` one at a time, the top-1 agreement and the logits' rms error over
the float32 file's logits rms.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter
from litert_quantizer import quantizer
from litert_quantizer import recipe

RECIPES = {
    "weight_only_int8": recipe.weight_only_wi8_afp32,
    "dynamic_int8": recipe.dynamic_wi8_afp32,
    "weight_only_int4": recipe.weight_only_wi4_afp32,
    "dynamic_int4_block32": recipe.dynamic_wi4b32_afp32,
}


def quantized(path, name, out):
    target = os.path.join(out, f"{os.path.basename(path)[:-7]}.{name}.tflite")
    qt = quantizer.Quantizer(path)
    qt.load_quantization_recipe(RECIPES[name]())
    qt.quantize().export_model(target, overwrite=True)
    return target


def decode_runner(path):
    interp = Interpreter(model_path=path, num_threads=1)
    return interp.get_signature_runner("decode")


def teacher_forced(path, tokens):
    runner = decode_runner(path)
    details = runner.get_input_details()
    caches = [n for n in details if n.startswith("kv_")]
    state = {n: np.zeros(details[n]["shape"], details[n]["dtype"]) for n in caches}
    rows = []
    for position, token in enumerate(tokens):
        out = runner(
            tokens=np.array([[token]], np.int32),
            input_pos=np.array([position], np.int32),
            **state,
        )
        state = {n: out[n] for n in state}
        rows.append(out["logits"][0, -1])
    return np.stack(rows)


def decode_ms(paths, rounds=15, position=127):
    calls = {}
    for name, path in paths.items():
        runner = decode_runner(path)
        details = runner.get_input_details()
        inputs = {n: np.zeros(d["shape"], d["dtype"]) for n, d in details.items()}
        inputs["tokens"] = np.array([[5]], np.int32)
        inputs["input_pos"] = np.array([position], np.int32)
        runner(**inputs)
        calls[name] = (runner, inputs)
    samples = {name: [] for name in paths}
    names = list(paths)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runner, inputs = calls[name]
            start = time.thread_time()
            for _ in range(20):
                runner(**inputs)
            samples[name].append((time.thread_time() - start) / 20 * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--out", default="/tmp/litert_quantizer_eval")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    paths = {"float32": args.file}
    for name in RECIPES:
        try:
            paths[name] = quantized(args.file, name, args.out)
        # A recipe that fails is a finding, reported in the table.
        except Exception as e:
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}")
    vocabulary = decode_runner(args.file).get_output_details()["logits"]["shape"][-1]
    tokens = np.random.default_rng(0).integers(1, vocabulary, 64)
    reference = teacher_forced(args.file, tokens)
    scale = float(np.sqrt(np.mean(reference**2)))
    ms = decode_ms(paths)
    print("| recipe | size MB | decode ms | top-1 agreement | logits rms err / rms |")
    print("|---|---|---|---|---|")
    for name, path in paths.items():
        logits = teacher_forced(path, tokens)
        agree = float(np.mean(logits.argmax(-1) == reference.argmax(-1)))
        err = float(np.sqrt(np.mean((logits - reference) ** 2))) / scale
        size = os.path.getsize(path) / 1e6
        print(f"| {name} | {size:.1f} | {ms[name]:.2f} | {agree:.3f} | {err:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
