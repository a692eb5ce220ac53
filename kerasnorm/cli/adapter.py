"""`kerasnorm export-adapter`: a LoRA fine-tune's adapters as the file
LiteRT-LM's engine feeds a base bundle.

    kerasnorm export-adapter MODEL --lora-weights FILE.lora.h5 --out DIR
        [--lora-rank R] [--force]
        [--import MODULE|FILE.py ...] [--no-safe-mode] [--verbose]

Loads the base keras-hub CausalLM (a `.keras` file or a `save_to_preset`
folder) with the adapters of a fine-tune (`backbone.save_lora_weights`'
file; Keras saves a LoRA model's kernels merged, without its adapters) and
writes `DIR/<name>.lora.tflite`
(`kerasnorm.export.write_lora_adapter`), for the base bundle `kerasnorm
export --format litert_lm --lora runtime` wrote of the same base weights.
Exit statuses as `kerasnorm export`'s: 0 written, 2 refused (bad
arguments, an unreadable model), 3 the model's adapters cannot be written
(LoRA the engine takes no input for, a rank it does not run).
"""

from __future__ import annotations

import sys

from kerasnorm.cli._load import load_for


def run(args) -> int:
    """Write the adapter file; the outcome."""
    try:
        model = load_for(args, "export-adapter")
    except (ValueError, OSError) as err:
        print(f"kerasnorm export-adapter: error: {err}", file=sys.stderr)
        return "usage"
    from kerasnorm.export import write_lora_adapter

    try:
        adapter = write_lora_adapter(
            model, args.target, lora_rank=args.lora_rank, overwrite=args.force
        )
    except ValueError as err:
        print(f"kerasnorm export-adapter: {err}", file=sys.stderr)
        return "conversion"
    print(
        f"{adapter.path}: rank {adapter.rank}, {len(adapter.inputs)} tensors, "
        f"{adapter.size_bytes} bytes (LoRA weights {adapter.lora_bytes} bytes "
        "in float32)"
    )
    return "ok"
