"""Timing training steps with and without XLA, interleaved, to pick one."""

import dataclasses
import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class JitMeasurement:
    """What `compile(..., jit_compile="measure")` timed on the sample batch.

    Attributes:
        jit_compile: the mode chosen, the fastest: `True` (the whole step
            under XLA), `False` (no XLA) or `"norms"` (XLA for the
            normalization layers only); pass it to `compile` to force the
            same mode.
        xla_step_seconds: median seconds per training step with XLA.
        no_xla_step_seconds: median seconds per training step without XLA.
        xla_first_step_seconds: the first step with XLA, compilation included.
        no_xla_first_step_seconds: the first step without XLA (tracing).
        norms_step_seconds: median seconds per step with only the
            normalization layers under XLA; `None` when the model has no
            normalization layer (the mode would equal no XLA).
        norms_first_step_seconds: that mode's first step; `None` likewise.
        rounds: how many interleaved rounds were timed (more when the
            fastest two modes were close after the first rounds).
    """

    jit_compile: bool | str
    xla_step_seconds: float
    no_xla_step_seconds: float
    xla_first_step_seconds: float
    no_xla_first_step_seconds: float
    norms_step_seconds: float | None = None
    norms_first_step_seconds: float | None = None
    rounds: int = 0

    @property
    def speedup(self) -> float:
        """Step time without XLA over step time with XLA."""
        return self.no_xla_step_seconds / self.xla_step_seconds

    @property
    def chosen_step_seconds(self) -> float:
        """The median step time of the mode chosen."""
        return {
            True: self.xla_step_seconds,
            False: self.no_xla_step_seconds,
            "norms": self.norms_step_seconds,
        }[self.jit_compile]

    def __str__(self) -> str:
        norms = ""
        if self.norms_step_seconds is not None:
            norms = (
                f", {self.norms_step_seconds * 1e3:.3g} ms with XLA for the "
                "normalization layers only"
            )
        return (
            f"jit_compile={self.jit_compile!r}: step "
            f"{self.xla_step_seconds * 1e3:.3g} ms with XLA, "
            f"{self.no_xla_step_seconds * 1e3:.3g} ms without{norms} "
            f"(XLA speedup {self.speedup:.2f}x, {self.rounds} rounds); first "
            f"step {self.xla_first_step_seconds:.3g} s with XLA, "
            f"{self.no_xla_first_step_seconds:.3g} s without"
        )


def median_step_times(
    run: Callable[[object], None],
    rounds: int,
    timer: Callable[[], float] = time.perf_counter,
    modes: Sequence = (True, False),
    max_rounds: int | None = None,
    separation: float = 0.05,
) -> tuple[dict, int]:
    """Median seconds of `run(mode)` for each of `modes`, interleaved.

    The modes take turns within every round, and which goes first rotates
    between rounds, so load from other processes and clock-frequency drift
    hit all alike. After `rounds` rounds, while the fastest two medians are
    within `separation` (relative) of each other, more rounds are timed, up
    to `max_rounds`: a close call gets more samples, a clear one costs no
    more than `rounds`.

    Returns:
        (dict mode -> median seconds, rounds timed).
    """
    modes = list(modes)
    samples = {mode: [] for mode in modes}
    limit = max(rounds, max_rounds or rounds)
    for r in range(limit):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            start = timer()
            run(mode)
            samples[mode].append(timer() - start)
        medians = {mode: statistics.median(t) for mode, t in samples.items()}
        if r + 1 >= rounds and _separated(medians, separation):
            break
    return medians, r + 1


def _separated(medians, separation):
    if len(medians) < 2:
        return True
    best, second = sorted(medians.values())[:2]
    return second > best * (1 + separation)
