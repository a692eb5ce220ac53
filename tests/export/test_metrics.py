"""`output_errors` (`numerics/metrics.py`, public): the error metrics every
check reports, against numpy written from their definitions."""

import numpy as np
import pytest

from kerasnorm.export import output_errors

pytestmark = pytest.mark.tf_only


def test_output_errors_are_the_definitions_worst_output_counting():
    rng = np.random.default_rng(0)
    expected = [rng.standard_normal((8, 3)), 10 * rng.standard_normal((8,))]
    got = [
        e + rng.normal(0, s, e.shape)
        for e, s in zip(expected, (0.1, 0.01), strict=True)
    ]
    max_abs, max_rel, rms_rel = output_errors(got, expected)
    diffs = [np.abs(g - e) for g, e in zip(got, expected, strict=True)]
    assert max_abs == pytest.approx(max(d.max() for d in diffs))
    assert max_rel == pytest.approx(
        max(d.max() / np.abs(e).max() for d, e in zip(diffs, expected, strict=True))
    )
    assert rms_rel == pytest.approx(
        max(
            np.sqrt(np.mean(d**2)) / np.sqrt(np.mean(e**2))
            for d, e in zip(diffs, expected, strict=True)
        )
    )


def test_output_errors_non_finite_rule_and_zero_scale():
    nan, inf = np.nan, np.inf
    # Equal non-finite values agree; a NaN against a number fails every bound.
    assert output_errors([np.array([nan, inf, 1.0])], [np.array([nan, inf, 1.0])]) == (
        0.0,
        0.0,
        0.0,
    )
    assert output_errors([np.array([nan, 1.0])], [np.array([2.0, 1.0])])[0] == inf
    # An all-zero output: no division by zero, the absolute error stays.
    max_abs, max_rel, _ = output_errors([np.array([1e-3])], [np.zeros(1)])
    assert max_abs == pytest.approx(1e-3) and np.isfinite(max_rel) and max_rel > 1
    # `got` is reshaped to `expected` (a runner's flat output).
    assert output_errors([np.arange(6.0)], [np.arange(6.0).reshape(2, 3)])[0] == 0.0


def test_max_rel_over_shapes_divides_by_the_largest_output_of_any():
    """Two calls of a dynamic artifact (the second a smaller batch): per
    output, the largest difference of either over the largest |expected|
    of either, so that it is the max abs error over the output scale."""
    from kerasnorm.export.numerics.metrics import max_rel_over

    rng = np.random.default_rng(1)
    first = [10 * rng.standard_normal((8, 3)), rng.standard_normal((8,))]
    second = [e[:1] / 10 for e in first]  # a small sample: a small scale
    calls = [
        ([e + rng.normal(0, 0.01, e.shape) for e in first], first),
        ([e + rng.normal(0, 0.02, e.shape) for e in second], second),
    ]
    want = max(
        max(np.abs(g[o] - e[o]).max() for g, e in calls)
        / max(np.abs(e[o]).max() for _, e in calls)
        for o in range(2)
    )
    assert max_rel_over(calls) == pytest.approx(want)
    # Its own scale would have made the second call's error the larger.
    assert output_errors(*calls[1])[1] > max_rel_over(calls)
    # One call: output_errors' own.
    assert max_rel_over(calls[:1]) == pytest.approx(output_errors(*calls[0])[1])
