"""Side-by-side timing of the benchmarks under benchmarks/ and export/.

These machines are shared and noisy: the candidates are timed in rounds, one
measurement of each per round in a rotating order, so that load from other
processes hits all of them alike, and each candidate's median is kept.
"""

import statistics
import time


def interleaved_medians(candidates, rounds):
    """Median of `rounds` measurements of each candidate.

    Args:
        candidates: dict name -> zero-argument callable returning one
            measurement (seconds).
        rounds: how many measurements of each candidate.

    Returns:
        dict name -> median seconds.
    """
    names = list(candidates)
    samples = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(candidates[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def burst_timer(call, *args, seconds=0.005, clock=time.perf_counter):
    """A zero-argument timer for `interleaved_medians`: `clock` seconds per
    call of `call(*args)`, over a burst of calls.

    The burst's length is set once, here: as many calls as take `seconds`
    (after one call that warms up), so that the clock's resolution and the
    call overhead do not dominate a model that runs in 0.1 ms. Pass
    `clock=time.thread_time` for the calling thread's CPU time, which other
    jobs of a shared machine do not inflate (LiteRT on one thread computes
    in the calling thread).
    """
    call(*args)
    start, calls = clock(), 0
    while clock() - start < seconds:
        call(*args)
        calls += 1
    n = max(calls, 1)

    def measure():
        start = clock()
        for _ in range(n):
            call(*args)
        return (clock() - start) / n

    return measure
