"""Timing training steps with and without XLA, interleaved, to pick one."""

import dataclasses
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class JitMeasurement:
    """What `compile(..., jit_compile="measure")` timed on the sample batch.

    Attributes:
        jit_compile: the mode chosen, the faster of the two.
        xla_step_seconds: median seconds per training step with XLA.
        no_xla_step_seconds: median seconds per training step without XLA.
        xla_first_step_seconds: the first step with XLA, compilation included.
        no_xla_first_step_seconds: the first step without XLA (tracing).
    """

    jit_compile: bool
    xla_step_seconds: float
    no_xla_step_seconds: float
    xla_first_step_seconds: float
    no_xla_first_step_seconds: float

    @property
    def speedup(self) -> float:
        """Step time without XLA over step time with XLA."""
        return self.no_xla_step_seconds / self.xla_step_seconds

    def __str__(self) -> str:
        return (
            f"jit_compile={self.jit_compile}: step "
            f"{self.xla_step_seconds * 1e3:.3g} ms with XLA, "
            f"{self.no_xla_step_seconds * 1e3:.3g} ms without "
            f"({self.speedup:.2f}x); first step "
            f"{self.xla_first_step_seconds:.3g} s with XLA, "
            f"{self.no_xla_first_step_seconds:.3g} s without"
        )


def median_step_times(
    run: Callable[[bool], None],
    rounds: int,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[bool, float]:
    """Median seconds of `run(True)` (XLA) and `run(False)`, interleaved.

    The two alternate within every round, and which goes first alternates
    between rounds, so load from other processes and clock-frequency drift
    hit both alike.
    """
    samples = {True: [], False: []}
    for r in range(rounds):
        for mode in (True, False) if r % 2 == 0 else (False, True):
            start = timer()
            run(mode)
            samples[mode].append(timer() - start)
    return {mode: statistics.median(times) for mode, times in samples.items()}
