"""`write_lora_adapter`: a fine-tuned model's LoRA adapters as the file
LiteRT-LM's engine feeds a `to_litert_lm(..., lora="runtime")` base file."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from kerasnorm.export.litert_lm.adapter_file import adapter_bytes
from kerasnorm.export.litert_lm.adapter_file import read_adapter
from kerasnorm.export.litert_lm.runtime_lora import runtime_lora
from kerasnorm.export.staging.atomic import refuse_existing
from kerasnorm.export.staging.atomic import staged


@dataclasses.dataclass
class LoraAdapter:
    """What `write_lora_adapter` wrote."""

    path: str
    rank: int
    # The adapter's tensors: the base file's input names they feed.
    inputs: tuple
    size_bytes: int
    # The model's LoRA weights (`lora_kernel_a`, `lora_kernel_b`) in
    # float32: the file holds them, scaled, and its tables of names.
    lora_bytes: int


def write_lora_adapter(
    model,
    path: str | os.PathLike,
    *,
    lora_rank: int | None = None,
    base: bool = False,
    overwrite: bool = False,
) -> LoraAdapter:
    """Write the LoRA adapters of `model` as a LiteRT-LM adapter file.

    `model` is a keras-hub `CausalLM` fine-tuned with
    `backbone.enable_lora(rank)`. The file feeds the base file
    `to_litert_lm(base, ..., lora="runtime")` wrote of the same base
    weights: one float32 tensor per adapter input of the base file
    (`lora_atten_{q,k,v,o}_{a,b}_prime_weight_<layer>`, Keras'
    `lora_alpha / rank * lora_kernel_a` and `lora_kernel_b`), a
    `lora_params` subgraph and `lora_rank` metadata, as litert-torch
    writes adapters. Several fine-tunes of one base model give several
    adapters for one bundle; LiteRT-LM's engine takes one per
    conversation:

    ```
    engine = litert_lm.Engine(
        "base.litertlm", lora_rank_config=litert_lm.LoraRankConfig(lora_rank=4)
    )
    chat = engine.create_conversation(
        lora_config=litert_lm.LoraConfig(lora_path="task.tflite")
    )
    ```

    A conversation without an adapter leaves the inputs unset in LiteRT-LM
    0.18.1 (its replies are garbage): the base model answers with the zero
    adapter, `base=True`.

    LoRA on layers the engine takes no inputs for (a feed-forward, the
    embedding) is refused by name: export such a model with
    `to_litert_lm(..., lora="merge")`.

    Args:
        model: the fine-tuned keras-hub CausalLM.
        path: the adapter's `.tflite` path.
        lora_rank: the base file's adapter rank, when it reserved a larger
            one than the model's (`to_litert_lm(..., lora_rank=)`): the
            adapter is zero-padded to it. Defaults to `None`, the model's.
        base: write the zero adapter (every input zero): the conversation
            that answers as the base model. Defaults to `False`.
        overwrite: replace an existing file. Defaults to `False`.
    """
    path = os.fspath(path)
    lora = runtime_lora(model, lora_rank, caller="write_lora_adapter")
    refuse_existing(path, overwrite)
    tensors = lora.zeros() if base else lora.tensors()
    content = adapter_bytes(tensors, lora.rank)
    rank, read = read_adapter(content)
    if rank != lora.rank or any(
        not np.array_equal(read[name], value) for name, value in tensors.items()
    ):
        raise AssertionError("write_lora_adapter: the file reads back differently")
    with staged(path, directory=False) as tmp:
        with open(tmp, "wb") as f:
            f.write(content)
    layers = [item.layer for item in lora.adapted]
    weights = [w for x in layers for w in (x.lora_kernel_a, x.lora_kernel_b)]
    return LoraAdapter(
        path=path,
        rank=lora.rank,
        inputs=tuple(tensors),
        size_bytes=len(content),
        lora_bytes=sum(4 * int(np.prod(v.shape)) for v in weights),
    )
