"""One `kerasnorm demo --quick --force` run, for
`test_cli_demo.test_quick_demo_end_to_end` to check.

    python tests/cli/quick_demo.py prepare DIR      # DIR/out, with leftovers
    python tests/cli/quick_demo.py run DIR          # the demo into DIR/out

`run` runs `kerasnorm` as found on PATH (the console script) and keeps its
stdout, stderr and exit status in DIR. `.ci/run` prepares with the
checkout's Python and runs the demo from the wheel's virtual environment
(the release check it makes anyway), then runs the test with
`KERASNORM_DEMO_RUN=DIR`: the test checks that run instead of running the
demo again. Without the variable the test prepares and runs its own.
Imports nothing of kerasnorm's.
"""

import os
import subprocess
import sys


def prepare(directory):
    """`directory/out` with a file of the user's and two leftovers of an
    earlier run, which `--force` must replace."""
    out = os.path.join(directory, "out")
    os.makedirs(out)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine\n")
    with open(os.path.join(out, "conv_net.tflite"), "wb") as f:
        f.write(b"stale")
    with open(os.path.join(out, "report.json"), "w") as f:
        f.write("{stale")
    return out


def run(directory, command=("kerasnorm",), cwd=None, env=None):
    """The demo into `directory/out`; its stdout, stderr and exit status
    kept in `directory`. Returns them."""
    out = os.path.join(directory, "out")
    result = subprocess.run(
        [*command, "demo", "--quick", "--force", "--out", out],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )
    for name, text in (
        ("stdout", result.stdout),
        ("stderr", result.stderr),
        ("returncode", str(result.returncode)),
    ):
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)
    return result.returncode, result.stdout, result.stderr


def read(directory):
    """`(returncode, stdout, stderr)` of the run kept in `directory`."""
    texts = []
    for name in ("returncode", "stdout", "stderr"):
        with open(os.path.join(directory, name)) as f:
            texts.append(f.read())
    return int(texts[0]), texts[1], texts[2]


if __name__ == "__main__":
    action, directory = sys.argv[1:]
    if action == "prepare":
        prepare(directory)
    else:
        # The status is the test's to judge (it prints the stderr).
        run(directory)
