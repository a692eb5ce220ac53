"""Side-by-side timing shared by the repository's scripts (not public API).

`benchmarks/*.py` and `examples/*.py` both time candidates this way. It lives
in the package because that is what both import without editing `sys.path`:
a script's own folder is on the path, the repository root is not, and the
installed (or editable) `kerasnorm` is.

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
