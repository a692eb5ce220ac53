"""litert-torch's generative files of a real checkpoint (SmolLM2-135M-Instruct
or Gemma 3 270M), for `export/bench_real_models.py` (the benchmark peer;
kerasnorm never imports it).

Run it in its own environment, not kerasnorm's (litert-torch 0.10 needs
PyTorch; the CPU wheel)::

    python3 -m venv /tmp/lt-venv
    /tmp/lt-venv/bin/pip install torch==2.13.0 litert-torch==0.10.0
    /tmp/lt-venv/bin/python export/peers/litert_torch_real.py HF_DIR OUT_DIR \\
        --model smollm2 --quantize none dynamic_int8 weight_only_int8 \\
        dynamic_int4_block32 dynamic_int4_block128

`HF_DIR` is a Hugging Face checkpoint folder (`model.safetensors`,
`config.json`) that `tests/support/real_models.write_hf_checkpoint` writes
from the same dequantized GGUF weights kerasnorm's side loads. The model is
built by litert-torch's own example builder (`smollm.build_model_v2`,
`gemma3.build_model_1b` with the 270M configuration) and converted with its
converter, context `--cache` (512), prefill signatures `--prefill` (32
128), its default export configuration for the family (SmolLM2: the cache
`[1, L, g, d]`, the mask made inside; Gemma 3: its example's transposed
cache and mask as an input; `--transpose`: the transposed cache, which
LiteRT-LM's engine needs). It writes `<model>_<recipe>.tflite` and prints
each file's size, or the converter's error for a recipe that fails.
"""

import argparse
import glob
import os
import shutil
import sys
import time
import traceback


def build(model, hf_dir, cache):
    if model == "smollm2":
        from litert_torch.generative.examples.smollm import smollm

        return smollm.build_model_v2(hf_dir, mask_cache_size=cache), None
    from litert_torch.generative.examples.gemma3 import decoder

    config = decoder.get_decoder_config_270m()
    return decoder.build_model_270m(hf_dir, mask_cache_size=0), config


def export_config(model, transpose):
    from litert_torch.generative.layers import kv_cache
    from litert_torch.generative.utilities import export_config as ec

    config = ec.ExportConfig()
    if transpose:
        config.kvcache_layout = kv_cache.KV_LAYOUT_TRANSPOSED
    if model == "gemma3":
        config.kvcache_layout = kv_cache.KV_LAYOUT_TRANSPOSED
        config.mask_as_input = True
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir")
    parser.add_argument("out")
    parser.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    parser.add_argument("--quantize", nargs="+", default=["none"])
    parser.add_argument("--cache", type=int, default=512)
    parser.add_argument("--prefill", type=int, nargs="+", default=[32, 128])
    # LiteRT-LM's engine reads the context from the caches' dimension 2:
    # litert-torch's default [1, L, g, d] reads as a context of g.
    parser.add_argument("--transpose", action="store_true", help="caches [1, g, L, d]")
    args = parser.parse_args()
    from litert_torch.generative.utilities import converter

    os.makedirs(args.out, exist_ok=True)
    for quantize in args.quantize:
        suffix = "_transposed" if args.transpose else ""
        target = os.path.join(args.out, f"{args.model}_{quantize}{suffix}.tflite")
        if os.path.exists(target):
            print(target, os.path.getsize(target), "(kept)", flush=True)
            continue
        work = os.path.join(args.out, "work")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        start = time.perf_counter()
        try:
            model, config = build(args.model, args.hf_dir, args.cache)
            converter.convert_to_tflite(
                model.eval(),
                output_path=work,
                output_name_prefix=args.model,
                prefill_seq_len=args.prefill,
                kv_cache_max_len=args.cache,
                quantize=quantize,
                config=config or model.config,
                export_config=export_config(args.model, args.transpose),
            )
        except Exception as error:  # the converter's refusal is a finding
            traceback.print_exc(file=sys.stderr)
            print(
                f"FAILED {quantize}: {type(error).__name__}: {error}"[:600], flush=True
            )
            continue
        (written,) = glob.glob(os.path.join(work, "*.tflite"))
        shutil.move(written, target)
        shutil.rmtree(work)
        seconds = time.perf_counter() - start
        print(target, os.path.getsize(target), f"{seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
