"""litert-torch's generative file of a Llama-style model, for
`export/bench_generation.py` (the benchmark peer; kerasnorm never imports it).

Run it in its own environment, not kerasnorm's: litert-torch 0.10 needs
PyTorch and imports TensorFlow's LiteRT schema without declaring TensorFlow::

    python3.11 -m venv /tmp/litert_torch_venv
    /tmp/litert_torch_venv/bin/pip install torch==2.13.0
    /tmp/litert_torch_venv/bin/pip install "litert-torch==0.10.*" tensorflow \\
        torch==2.13.0
    /tmp/litert_torch_venv/bin/python export/peers/litert_torch_llama.py OUT_DIR \\
        --cache 256 512 --quantize none dynamic_int8 dynamic_int4_block32 \\
        weight_only_int8

(Run as written with litert-torch 0.10.0, TensorFlow 2.21.0, PyTorch
2.13.0+cpu, ai-edge-quantizer 0.10.0, issue 50: repeating the torch pin
keeps pip from pulling another PyTorch; about 30 s a file on 2 cores.
`dynamic_int4_block32` prints a NumPy "invalid value encountered in cast"
warning from ai-edge-quantizer; the files run.)

It builds litert-torch's own decoder (its TinyLlama class) with the
configuration the benchmark compares: vocabulary 32000, 4 layers, hidden 256,
4 query heads of 64, 2 key/value heads, intermediate 768 (which int4 blocks
of 32 divide), RMSNorm, SwiGLU,
rotary positions; random weights (seed 0); and writes
`llama_<quantize>_c<cache>.tflite` with signatures `prefill_16` ... and
`decode`, litert-torch's default cache layout and no mask input.
"""

import argparse
import glob
import os
import shutil

import torch
from litert_torch.generative.examples.tiny_llama import tiny_llama
from litert_torch.generative.layers import model_config as cfg
from litert_torch.generative.utilities import converter
from litert_torch.generative.utilities import export_config


def llama_config(cache):
    attention = cfg.AttentionConfig(
        num_heads=4,
        head_dim=64,
        num_query_groups=2,
        rotary_base=10000,
        rotary_percentage=1.0,
    )
    feed_forward = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.GATED,
        activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
        intermediate_size=768,
    )
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM)
    block = cfg.TransformerBlockConfig(
        attn_config=attention,
        ff_config=feed_forward,
        pre_attention_norm_config=norm,
        post_attention_norm_config=norm,
    )
    return cfg.ModelConfig(
        vocab_size=32000,
        num_layers=4,
        max_seq_len=cache,
        embedding_dim=256,
        block_configs=block,
        final_norm_config=norm,
        lm_head_share_weight_with_embedding=False,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--cache", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--quantize", nargs="+", default=["none", "dynamic_int8"])
    parser.add_argument("--prefill", type=int, nargs="+", default=[16, 128])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for cache in args.cache:
        for quantize in args.quantize:
            torch.manual_seed(0)
            config = llama_config(cache)
            # The causal mask is made inside, from input_pos, over a cache-sized
            # table (what its converter flags do without --mask_as_input).
            model = tiny_llama.TinyLlama(config, mask_cache_size=cache).eval()
            work = os.path.join(args.out, "work")
            os.makedirs(work, exist_ok=True)
            converter.convert_to_tflite(
                model,
                output_path=work,
                output_name_prefix="llama",
                prefill_seq_len=args.prefill,
                kv_cache_max_len=cache,
                quantize=quantize,
                config=config,
                export_config=export_config.ExportConfig(),
            )
            (written,) = glob.glob(os.path.join(work, "*.tflite"))
            target = os.path.join(args.out, f"llama_{quantize}_c{cache}.tflite")
            shutil.move(written, target)
            shutil.rmtree(work)
            print(target, os.path.getsize(target))


if __name__ == "__main__":
    main()
