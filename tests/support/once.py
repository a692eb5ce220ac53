"""What a module fixture builds, built once per test process.

Under `pytest -n 2 --dist loadgroup` (.ci/run) a worker that runs out of
queued tests tears its module fixtures down; when it is given more of the
same module's tests it sets them up again: a trained model trained twice,
an export exported twice (CI's slow tier paid a second 100-150 s
distributed-training run, the default tier a second 26 s training). A
fixture that returns `once(key, build)` builds on the first call of each
process and returns the same object after.

What is kept must not be changed by the tests that share it, as for any
module fixture, and lives until the process ends: keep it to small models
and reports.
"""

_BUILT = {}


def once(key, build):
    """`build()`, called the first time `key` is asked for in this
    process; the same result every later time."""
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]
