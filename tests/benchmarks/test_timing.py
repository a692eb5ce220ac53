"""benchmarks/timing.py: the round-robin medians the benchmarks report."""

import pytest

from benchmarks.timing import interleaved_medians


def test_order_rotates_each_round_and_medians_are_per_candidate():
    calls = []

    def candidate(name, values):
        values = iter(values)

        def measure():
            calls.append(name)
            return next(values)

        return measure

    medians = interleaved_medians(
        {
            "a": candidate("a", [1.0, 9.0, 2.0, 3.0]),
            "b": candidate("b", [5.0, 4.0, 6.0, 100.0]),
            "c": candidate("c", [7.0, 7.0, 8.0, 0.0]),
        },
        rounds=4,
    )
    # Round r starts with candidate r mod 3, so each leads in turn.
    assert calls == [*"abc", *"bca", *"cab", *"abc"]
    assert medians == {"a": 2.5, "b": 5.5, "c": 7.0}


def test_zero_rounds_have_no_median():
    with pytest.raises(ValueError, match="no median"):
        interleaved_medians({"a": lambda: 1.0}, rounds=0)
