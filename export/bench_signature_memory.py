"""Resident memory of running every signature of a `.tflite` file, per
LiteRT runtime: the interpreter (each signature packs its own XNNPACK
weights) against the `CompiledModel` with and without XNNPACK's weight
cache (one packed copy for all the signatures).

    PYTHONPATH=$PWD python -m export.bench_signature_memory FILE.tflite

One child process per variant: the file read, then the runtime built
(resident increase "built") and every signature called once on seeded
inputs ("ran": the increase after, "peak": its high-water mark, both over
the resident memory before building). The outputs are compared with the
interpreter's (the largest difference over the largest magnitude). Needs
ai-edge-litert 2.1.6 or later (`CpuOptions.xnnpack_weight_cache_path`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

VARIANTS = {
    "interpreter": "Interpreter, a signature runner each",
    "interpreter-latest": "Interpreter, experimental_default_delegate_latest_features",
    "compiled": "CompiledModel, no weight cache",
    "compiled-file": "CompiledModel, weight cache in a temporary file",
    "compiled-memory": 'CompiledModel, weight cache ":memory"',
}
GIB = 1024**3


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _feed(details):
    """Seeded inputs by name (the seed from the name, so every runtime gets
    the same arrays whatever order it lists them in)."""
    feed = {}
    for name, detail in details.items():
        shape = [int(s) for s in detail["shape"]]
        dtype = np.dtype(detail["dtype"])
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if name == "input_pos":
            feed[name] = (np.arange(shape[0]) + 3).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            feed[name] = rng.integers(1, 1000, shape).astype(dtype)
        else:
            feed[name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
    return feed


def _interpreter(content, **options):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content, **options)
    interp.allocate_tensors()
    runners = {k: interp.get_signature_runner(k) for k in interp.get_signature_list()}
    built = _status("VmRSS")
    outs = {k: r(**_feed(r.get_input_details())) for k, r in runners.items()}
    return built, outs, interp


def _compiled(content, cache):
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.options import CpuOptions
    from ai_edge_litert.options import Options

    cpu = CpuOptions(num_threads=1, xnnpack_weight_cache_path=cache)
    model = CompiledModel.from_buffer(content, options=Options(cpu_options=cpu))
    built = _status("VmRSS")
    outs = {}
    for key in model.get_signature_list():
        ins = model.get_input_tensor_details(key)
        details = model.get_output_tensor_details(key)
        feed = _feed(ins)
        buffers = {n: model.create_input_buffer_by_name(key, n) for n in ins}
        results = {n: model.create_output_buffer_by_name(key, n) for n in details}
        for name, buffer in buffers.items():
            buffer.write(feed[name])
        model.run_by_name(key, buffers, results)
        outs[key] = {
            n: results[n]
            .read(int(np.prod(d["shape"])), np.dtype(d["dtype"]))
            .reshape(d["shape"])
            for n, d in details.items()
        }
    return built, outs, model


def _child(variant, path, out):
    # The runtimes' libraries loaded before the baseline.
    import ai_edge_litert.compiled_model
    import ai_edge_litert.interpreter  # noqa: F401

    with open(path, "rb") as f:
        content = f.read()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with tempfile.TemporaryDirectory() as tmp:
        if variant == "interpreter":
            built, outs, _ = _interpreter(content)
        elif variant == "interpreter-latest":
            options = {"experimental_default_delegate_latest_features": True}
            built, outs, _ = _interpreter(content, **options)
        else:
            cache = {
                "compiled": "",
                "compiled-file": os.path.join(tmp, "weights.xnnpack_cache"),
                "compiled-memory": ":memory",
            }[variant]
            built, outs, _ = _compiled(content, cache)
        cache_bytes = sum(
            os.path.getsize(os.path.join(tmp, name)) for name in os.listdir(tmp)
        )
        ran = _status("VmRSS")
    np.savez(out, **{f"{k}/{n}": v for k, o in outs.items() for n, v in o.items()})
    print(
        "RESULT "
        + json.dumps(
            {
                "built": (built - before) / GIB,
                "ran": (ran - before) / GIB,
                "peak": (_status("VmHWM") - before) / GIB,
                "cache_file": cache_bytes,
            }
        )
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a .tflite file")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child, args.path, args.out)
    size = os.path.getsize(args.path) / GIB
    print(f"{args.path}: {size:.3f} GiB")
    with tempfile.TemporaryDirectory() as tmp:
        reference = None
        for variant in args.variants.split(","):
            out = os.path.join(tmp, f"{variant}.npz")
            run = subprocess.run(
                [
                    *(sys.executable, "-m", "export.bench_signature_memory"),
                    *(args.path, "--child", variant, "--out", out),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            line = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
            result = json.loads(line[-1][len("RESULT ") :])
            outputs = np.load(out)
            if reference is None:
                reference = outputs
            difference = max(
                float(np.abs(outputs[k] - reference[k]).max())
                / max(float(np.abs(reference[k]).max()), 1e-30)
                for k in reference.files
            )
            print(
                f"  {VARIANTS[variant]}: built +{result['built']:.2f} GiB, ran "
                f"+{result['ran']:.2f} GiB, peak +{result['peak']:.2f} GiB, "
                f"cache file {result['cache_file'] / 1e6:.0f} MB, outputs "
                f"against the first variant {difference:.1e}"
            )


if __name__ == "__main__":
    main()
