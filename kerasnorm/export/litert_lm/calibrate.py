"""What the weights pass takes besides the mode (`weights.quantize`): the
int4 block, Keras' own int4 weights, the list it notes its block fallbacks
in, and, where the mode's row asks for GPTQ (`gptq`), each product's inputs
on calibration sequences (`weights.calibration`).

The calibration sequences are the verification prompts and
`CALIBRATION_SEQUENCES` seeded sequences of `CALIBRATION_LENGTH` random ids
(capped by the context), run through the float model without a cache. (On
a real model random ids calibrate GPTQ badly: no row asks for it yet; see
`options.generative_modes`.)
"""

from __future__ import annotations

import numpy as np

from kerasnorm.export.litert_lm.check import reference_logits
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.weights.calibration import product_inputs

CALIBRATION_SEQUENCES = 4
CALIBRATION_LENGTH = 64


def calibration_sequences(prompts, vocabulary_size, max_sequence_length, seed=0):
    """`prompts` and the seeded random sequences (see the module)."""
    rng = np.random.default_rng(seed)
    length = min(CALIBRATION_LENGTH, max_sequence_length)
    random = [
        rng.integers(1, vocabulary_size, length).tolist()
        for _ in range(CALIBRATION_SEQUENCES)
    ]
    return [list(p) for p in prompts] + random


def weights_pass_options(model, quantize, block, known, prompts, cached, length):
    """`write_generative`'s options for the weights pass of `model` in mode
    `quantize` (`block`: the export's `int4_block_size`; `cached`: its
    `steps.CachedModel`, `length` its context)."""
    mode = GENERATIVE_MODES[quantize]
    calibration = None
    if mode.gptq and not known:
        sequences = calibration_sequences(prompts, cached.vocabulary_size, length)
        calibration = product_inputs(
            model, sequences, lambda ids: reference_logits(model, ids)
        )
    return {
        "int4_block_size": mode.block(block),
        "known_weights": known,
        "fallbacks": [],
        "calibration": calibration,
    }
