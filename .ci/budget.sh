# CI's time budget, sourced by .ci/run: each pass has a budget in seconds,
# and the whole run one of 3,610 s (about 60 minutes), so that a slow test is found
# the day it lands, not the day CI passes its 90-minute limit.
#
#   passed NAME BUDGET   after a pass: prints "ci pass: NAME: N s (budget
#                        BUDGET s)" and notes a pass over its budget
#   budget_verdict       at the end: the whole run's time against
#                        CI_TOTAL_BUDGET; exit status 1, with a line per pass
#                        over its budget, when any pass or the whole run is
#                        over.
#
# Every pass runs even when one is over, so that the log times them all.
# The budgets are the passes' times in the fresh check of 2026-12-04 on the
# 2-core AMD EPYC CI runs on (docs/benchmarks.md), with 20-30 % of room:
# over the 45 minutes the project aims at, so that CI fails on a new slow
# test, not on the round's measured time; docs/contributing.md says what to
# do when one fails.
CI_TOTAL_BUDGET=${CI_TOTAL_BUDGET:-3610}
# The clock: bash's seconds since the shell started, unless one is defined
# already (a test's).
if ! declare -F ci_clock > /dev/null; then
    ci_clock() { echo "$SECONDS"; }
fi
ci_start=$(ci_clock)
pass_start=$ci_start
over_budget=()

passed() {
    local name=$1 budget=$2 pass_end seconds
    pass_end=$(ci_clock)
    seconds=$((pass_end - pass_start))
    echo "ci pass: $name: $seconds s (budget $budget s)"
    if [ "$seconds" -gt "$budget" ]; then
        over_budget+=("the $name pass took $seconds s, over its budget of $budget s")
    fi
    pass_start=$pass_end
}

budget_verdict() {
    local total=$(($(ci_clock) - ci_start))
    echo "ci: $total s in all (budget $CI_TOTAL_BUDGET s)"
    if [ "$total" -gt "$CI_TOTAL_BUDGET" ]; then
        over_budget+=("the whole run took $total s, over its budget of $CI_TOTAL_BUDGET s")
    fi
    if [ "${#over_budget[@]}" -gt 0 ]; then
        local line
        for line in "${over_budget[@]}"; do
            echo "ci budget exceeded: $line (the slowest tests are listed above each pass's time)" >&2
        done
        return 1
    fi
}
