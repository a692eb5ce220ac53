"""litert-torch's generative files of the families it and kerasnorm both
write, on one small configuration, for `export/bench_hub_step.py --peer-dir`
(the benchmark peer; kerasnorm never imports it).

Run it in its own environment, not kerasnorm's (litert-torch needs
PyTorch), as `export/peers/litert_torch_llama.py`'s docstring says::

    python3.11 -m venv /tmp/lt-venv
    /tmp/lt-venv/bin/pip install torch==2.13.0
    /tmp/lt-venv/bin/pip install "litert-torch==0.10.*" tensorflow torch==2.13.0
    /tmp/lt-venv/bin/python export/peers/litert_torch_families.py OUT_DIR \\
        --cache 512 --quantize none dynamic_int8

Each family is litert-torch's own model class and configuration function
for it (Llama: `tiny_llama`; SmolLM2: `smollm` v2, its tied head; Gemma 3:
`gemma3.decoder`, every layer global; Qwen 2.5: `qwen`; Phi-3.5: `phi3`,
its long-context RoPE), shrunk to the configuration `bench_hub_step.py`
gives keras-hub's CausalLM of the family: vocabulary 8000, 4 layers,
hidden 256, 4 query heads of 64, 2 key/value heads, intermediate 688; random
weights (seed 0). It writes `<family>_<quantize>_c<cache>.tflite` with
signatures `prefill_16` and `decode`, litert-torch's default cache layout,
the causal mask made inside from `input_pos` (its converter's default).
"""

import argparse
import glob
import os
import shutil

import torch
from litert_torch.generative.examples.gemma3 import decoder as gemma3
from litert_torch.generative.examples.phi import phi3
from litert_torch.generative.examples.qwen import qwen
from litert_torch.generative.examples.smollm import smollm
from litert_torch.generative.examples.tiny_llama import tiny_llama
from litert_torch.generative.layers import model_config as cfg
from litert_torch.generative.utilities import converter
from litert_torch.generative.utilities import export_config

# bench_hub_step.MEDIUM and its 4 query / 2 key-value heads.
VOCABULARY, LAYERS, HIDDEN, INTERMEDIATE = 8000, 4, 256, 688
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64

# family: (configuration function, model class)
FAMILIES = {
    "llama": (tiny_llama.get_model_config, tiny_llama.TinyLlama),
    "smollm2": (smollm.get_model_config_v2, smollm.SmolLM2),
    "gemma3": (gemma3.get_decoder_config_1b, gemma3.Decoder),
    "qwen2": (qwen.get_0_5b_model_config, qwen.Qwen),
    "phi3": (phi3.get_model_config, phi3.Phi3_5Mini),
}


def small_config(family, cache):
    """litert-torch's configuration of `family`, shrunk as the module says."""
    config = FAMILIES[family][0]()
    config.vocab_size = VOCABULARY
    config.num_layers = LAYERS
    config.max_seq_len = cache
    config.embedding_dim = HIDDEN
    if config.embedding_scale is not None:
        config.embedding_scale = HIDDEN**0.5
    if isinstance(config.block_configs, list):
        config.block_configs = config.block_configs[:LAYERS]
        blocks = config.block_configs
    else:
        blocks = [config.block_configs]
    for block in blocks:
        block.attn_config.num_heads = HEADS
        block.attn_config.head_dim = HEAD_DIM
        block.attn_config.num_query_groups = KV_HEADS
        block.ff_config.intermediate_size = INTERMEDIATE
        if family == "gemma3":
            # keras-hub's side: use_sliding_window_attention=False.
            block.attn_config.attn_type = cfg.AttentionType.GLOBAL
    if family == "phi3":
        # Its RoPE's per-frequency factors, for a head of 64 (32 frequencies).
        rope = config.build_rope
        factors = rope.keywords["theta_factors"][: HEAD_DIM // 2]
        config.build_rope = type(rope)(
            rope.func, *rope.args, **{**rope.keywords, "theta_factors": factors}
        )
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--cache", type=int, nargs="+", default=[512])
    parser.add_argument("--quantize", nargs="+", default=["none"])
    parser.add_argument("--prefill", type=int, nargs="+", default=[16])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for family in args.families:
        for cache in args.cache:
            for quantize in args.quantize:
                torch.manual_seed(0)
                config = small_config(family, cache)
                model = FAMILIES[family][1](config, mask_cache_size=cache).eval()
                work = os.path.join(args.out, "work")
                os.makedirs(work, exist_ok=True)
                converter.convert_to_tflite(
                    model,
                    output_path=work,
                    output_name_prefix=family,
                    prefill_seq_len=args.prefill,
                    kv_cache_max_len=cache,
                    quantize=quantize,
                    config=config,
                    export_config=export_config.ExportConfig(),
                )
                (written,) = glob.glob(os.path.join(work, "*.tflite"))
                name = f"{family}_{quantize}_c{cache}.tflite"
                target = os.path.join(args.out, name)
                shutil.move(written, target)
                shutil.rmtree(work)
                print(target, os.path.getsize(target), flush=True)


if __name__ == "__main__":
    main()
