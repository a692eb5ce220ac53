"""What the weights pass takes besides the mode (`weights.quantize`): the
int4 block, Keras' own int4 weights, the list it notes its block fallbacks
in, and, where the mode's row asks for GPTQ (`gptq`), each product's inputs
on calibration sequences (`weights.calibration`).

The calibration sequences (`prompts.calibration_prompts`) run through the
float model without a cache: on a real model, text in its own tokenizer
held out from the check's (four seeded sequences of 64 random ids beside
them, as written before, calibrated GPTQ worse than rounding to nearest: on
SmolLM2-135M-Instruct off its GGUF grid, 0.505 top-1 agreement against
0.564 simulated; on the check's text prompts alone the file agreed 0.709,
perplexity 1.385x, against 0.556, 1.531x rounded to nearest,
docs/benchmarks.md "Real models"). So GPTQ calibrates on text only: the
model's own (`prompts.CALIBRATION_TEXTS`, when the check reads
`prompts.TEXT`) or the user's `verify_inputs` (`GIVEN`); a
model without a tokenizer, checked on invented ids, is rounded to nearest.
`"int4"`'s, `"dynamic"`'s and `"weight_only_int8"`'s rows ask for GPTQ
(`options.generative_modes`); each product is rounded by it only where its
calibration rows are enough (`weights.int_weights.int4_rounding`,
`int8_rounding`; the result's `gptq` lists them). A tied head's table is
calibrated where the row says so (`GenerativeMode.gptq_tied_head`; its
lookup reads the same rows).
The products the cached step fuses (`fused_products`: query/key/value,
gate/up) are calibrated as the one product the file holds.
"""

from __future__ import annotations

from kerasnorm.export.litert_lm.check import reference_logits
from kerasnorm.export.litert_lm.fused_products import fused_products
from kerasnorm.export.litert_lm.prompts import INVENTED
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.weights.calibration import product_inputs
from kerasnorm.export.weights.int_weights import weights_key


def weights_pass_options(model, quantize, block, known, prompts, source=None):
    """`write_generative`'s options for the weights pass of `model` in mode
    `quantize` (`block`: the export's `int4_block_size`; `prompts`: the
    sequences to calibrate on, `prompts.calibration_prompts`; `source`:
    where the check's prompts came from, `prompts.check_prompts`' second
    value)."""
    mode = GENERATIVE_MODES[quantize]
    calibration = None
    if mode.gptq and not known and source != INVENTED:
        sequences = [list(p) for p in prompts]
        # The products the step fuses, keyed as the file holds them.
        fused = [(weights_key(p.out_in()), p.layers[0]) for p in _fused(model)]
        calibration = product_inputs(
            model,
            sequences,
            lambda ids: reference_logits(model, ids),
            fused,
            tied_heads=mode.gptq_tied_head,
        )
    return {
        "int4_block_size": mode.block(block),
        "known_weights": known,
        "fallbacks": [],
        "calibration": calibration,
    }


def _fused(model):
    """The products the cached step of `model` fuses (`fused_products`;
    none for a model that is not a keras-hub CausalLM)."""
    try:
        import keras_hub
    except ImportError:
        return ()
    if not isinstance(model, keras_hub.models.CausalLM):
        return ()
    return fused_products(model)
