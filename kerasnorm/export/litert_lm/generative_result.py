"""What `to_litert_lm` returns."""

from __future__ import annotations

import dataclasses

from kerasnorm.export.litert_lm.check import GenerationCheck


@dataclasses.dataclass
class GenerativeExport:
    """What `to_litert_lm` wrote and measured."""

    path: str
    signatures: dict  # signature key -> its token length T
    max_sequence_length: int
    num_layers: int
    cache_shape: tuple  # (1, g, L, d) of layer 0
    quantize: str | None
    prefill_logits: str  # the prefills' outputs: "last", "all" or "none"
    size_bytes: int
    op_counts: dict
    check: GenerationCheck
    # How the decode step runs on XNNPACK (`verify.Delegation`), and its
    # median latency in ms on this machine; None where not measured.
    delegation: object = None
    decode_ms: float | None = None
    # A `.litertlm` bundle's: LiteRT-LM's model type, the chat template
    # written (None: none), what the result says of it (where it came from,
    # or why there is none), the start and stop token ids, and the run in
    # LiteRT-LM's engine (`engine.EngineRun`; `engine` says it in words, or
    # why it was not run).
    model_type: str | None = None
    chat_template: str | None = None
    chat: str | None = None
    start_token: int | None = None
    stop_tokens: tuple = ()
    engine_run: object = None
    engine: str | None = None
    # A model held in half precision: its dtype policy ("bfloat16", ...);
    # the file was written from its float32 copy, which `check` compares it
    # with, `original_check` with the model itself (teacher-forced).
    rebuilt_from: str | None = None
    original_check: GenerationCheck | None = None
    # The layers whose LoRA adapters were merged into their kernels.
    merged_lora: tuple = ()
    # `lora="runtime"`: the file's adapter inputs, their rank, and the
    # check of the file with zero adapters against the base model (`check`
    # fed the model's adapter, against the LoRA model).
    adapter_inputs: tuple = ()
    lora_rank: int | None = None
    base_check: GenerationCheck | None = None
    # Products `int4_block_size` does not divide (`weights.quantize.Fallback`).
    int4_fallbacks: tuple = ()
    # The products calibrated for GPTQ (`weights.edits.Rounded`, int4 or
    # int8 by its `bits`): each rounded by GPTQ, or to nearest on too few
    # calibration rows (`weights.int_weights.int4_rounding`,
    # `int8_rounding`); `rounding` says it in words.
    gptq: tuple = ()
    # The sites `smooth` rescaled while the file was written
    # (`fold.smooth.Smoothed`), and in words what it did or why not.
    smoothed: tuple = ()
    smoothing: str = "off"

    @property
    def int4_gptq(self) -> tuple:
        """The int4 products of `gptq`."""
        return tuple(r for r in self.gptq if r.bits == 4)

    @property
    def int4_rounding(self) -> str:
        """How the calibrated int4 products were rounded, in words."""
        if not self.int4_gptq:
            return "no product calibrated: int4 rounded to nearest"
        return _counted(self.int4_gptq, 4)

    @property
    def rounding(self) -> str:
        """How the file's calibrated products were rounded, in words."""
        if not self.gptq:
            return "no product calibrated: rounded to nearest"
        bits = sorted({r.bits for r in self.gptq})
        return "; ".join(
            _counted([r for r in self.gptq if r.bits == b], b) for b in bits
        )


def _counted(rounded, bits):
    gptq = sum(r.gptq for r in rounded)
    return (
        f"{gptq} of {len(rounded)} int{bits} products rounded by GPTQ, "
        f"{len(rounded) - gptq} to nearest (too few calibration rows)"
    )
