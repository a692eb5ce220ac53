"""Side-by-side timing of the benchmarks under benchmarks/ and export/.

These machines are shared and noisy: the candidates are timed in rounds, one
measurement of each per round in a rotating order, so that load from other
processes hits all of them alike, and each candidate's median is kept.
"""

import statistics


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
