"""How a generative file's decode step runs: its XNNPACK partitions and the
ops left outside them, and its latency per token.

The decode signature is written first (`write.write_generative`), so it is
the file's main graph, the one the interpreter lists ops for
(`verify.delegation` reads the split from there)."""

from __future__ import annotations

import time

import numpy as np

from kerasnorm.export.litert.generator import Generator
from kerasnorm.export.litert.runner import unallocated
from kerasnorm.export.verify.delegation import delegation

DECODE_TIMING_STEPS = 8


def decode_delegation(content):
    """The decode step's `Delegation` (`content`: the file's bytes)."""
    # Listed unallocated: allocating packs every signature's weights.
    inputs = unallocated(content).get_input_details()
    shapes = [tuple(i["shape"]) for i in inputs if "tokens" in i["name"]]
    if shapes != [(1, 1)]:
        raise AssertionError(
            "the generative file's main graph should be its decode step "
            f"(tokens (1, 1)); its token inputs are {shapes}"
        )
    return delegation(content)


def decode_ms(content, steps=DECODE_TIMING_STEPS):
    """The median time of one decode step, in ms, over `steps` steps after
    a one-token prompt (fewer in a short context)."""
    generator = Generator(content)
    generator.prefill([1])
    steps = min(steps, generator.max_sequence_length - 1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        generator.decode(1)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3
