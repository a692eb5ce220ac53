"""`output_errors` (`_common/metrics.py`, public): the error metrics every
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
