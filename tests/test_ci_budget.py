"""CI's time budget (.ci/budget.sh, sourced by .ci/run): a pass over its
budget, or a whole run over CI_TOTAL_BUDGET, fails the run at its end with
a line naming the pass, its time and its budget; every pass still runs.
A stand-in clock (`ci_clock`) gives the time each pass took."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = os.path.join(ROOT, ".ci", "budget.sh")


def _ci(passes, total_budget=3610, percent=None):
    """Bash sourcing budget.sh, then `(name, seconds, budget)` passes one
    after the other, then budget_verdict: (status, stdout, stderr)."""
    lines = [f"export CI_TOTAL_BUDGET={total_budget}", "now=0"]
    if percent is not None:
        lines.append(f"export CI_BUDGET_PERCENT={percent}")
    lines += ['ci_clock() { echo "$now"; }', f"source {BUDGET}"]
    for name, seconds, budget in passes:
        lines += [f"now=$((now + {seconds}))", f'passed "{name}" {budget}']
    lines += ["budget_verdict", 'echo "after the verdict"']
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def test_passes_within_their_budgets_pass():
    status, out, err = _ci([("default tier", 500, 600), ("slow tier", 1140, 1140)])
    assert status == 0, err
    assert "ci pass: default tier: 500 s (budget 600 s)" in out
    assert "ci pass: slow tier: 1140 s (budget 1140 s)" in out
    assert "ci: 1640 s in all (budget 3610 s)" in out
    assert "after the verdict" in out and err == ""


def test_a_pass_over_its_budget_fails_naming_it_after_every_pass_ran():
    status, out, err = _ci(
        [("default tier", 500, 600), ("slow tier", 1300, 1140), ("JAX", 100, 420)]
    )
    assert status == 1
    assert "ci pass: JAX: 100 s (budget 420 s)" in out  # the later pass ran
    assert "after the verdict" not in out
    assert err.strip().splitlines() == [
        "ci budget exceeded: the slow tier pass took 1300 s, over its budget "
        "of 1140 s (the slowest tests are listed above each pass's time)"
    ]


@pytest.mark.parametrize("total_budget", [1000, 1799])
def test_the_whole_run_over_its_budget_fails(total_budget):
    status, _, err = _ci([("a", 900, 1000), ("b", 900, 1000)], total_budget)
    assert status == 1
    assert f"the whole run took 1800 s, over its budget of {total_budget} s" in err


def test_budget_percent_scales_every_budget():
    """CI_BUDGET_PERCENT=150: a runner known to be slower gets half again
    every pass's budget and the whole run's."""
    passes = [("default tier", 800, 600), ("slow tier", 1000, 1140)]
    status, out, err = _ci(passes, total_budget=1200, percent=150)
    assert status == 0, err
    assert "ci pass: default tier: 800 s (budget 900 s)" in out
    assert "ci: 1800 s in all (budget 1800 s)" in out
    status, _, err = _ci(passes, total_budget=1200)
    assert status == 1
    assert "the default tier pass took 800 s, over its budget of 600 s" in err
    assert "the whole run took 1800 s, over its budget of 1200 s" in err


def test_ci_run_budgets_fit_the_whole_run():
    """Every pass of .ci/run has a budget, and they add up to at most the
    whole run's: a run within every pass's budget is within its own."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        calls = [line.split() for line in f if line.startswith("passed ")]
    budgets = [int(call[-1]) for call in calls]
    assert len(budgets) == 5, calls
    with open(os.path.join(ROOT, ".ci", "budget.sh")) as f:
        total = int(f.read().split("CI_TOTAL_BUDGET:-")[1].split("}")[0])
    assert sum(budgets) <= total
