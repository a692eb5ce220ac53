"""benchmarks/timing.py: the round-robin medians the benchmarks report, and
the burst timer each measurement is."""

import pytest

from benchmarks.timing import burst_timer
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


class _Clock:
    """A virtual clock that each call of `work` advances by `cost`."""

    def __init__(self, cost):
        self.now, self.cost, self.calls = 0.0, cost, 0

    def __call__(self):
        return self.now

    def work(self, x):
        assert x == "sample"
        self.calls += 1
        self.now += self.cost


def test_burst_timer_sizes_the_burst_once_and_returns_seconds_per_call():
    clock = _Clock(cost=0.001)
    measure = burst_timer(clock.work, "sample", seconds=0.005, clock=clock)
    # One warm-up call, then calls until 5 ms have passed on the clock.
    sizing = clock.calls
    assert sizing == 1 + 5
    assert measure() == pytest.approx(0.001)
    # Each measurement is a burst of the calls that fit in 5 ms.
    assert clock.calls - sizing == 5
    clock.cost = 0.003
    assert measure() == pytest.approx(0.003)
    assert clock.calls - sizing == 10


def test_burst_timer_of_a_slow_call_measures_one_call():
    clock = _Clock(cost=0.1)
    measure = burst_timer(clock.work, "sample", seconds=0.005, clock=clock)
    before = clock.calls
    assert measure() == pytest.approx(0.1)
    assert clock.calls - before == 1
