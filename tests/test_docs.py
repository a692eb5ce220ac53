"""Every Python block of README.md and export/README.md runs as written.

The blocks of one file run in order in one fresh interpreter, sharing one
namespace, in an empty working directory: a block may use what an earlier
block of the same file defined, and nothing else. A block preceded by a line
`<!-- no-run: reason -->` (a TF Serving client, say) is skipped.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

# The README's blocks export SavedModel and TFLite files: TensorFlow.
pytestmark = pytest.mark.tf_only

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", "export/README.md"]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NO_RUN = re.compile(r"<!--\s*no-run:\s*(.+?)\s*-->\s*$")


def python_blocks(text):
    """`(line, code)` of each Python block that is not marked no-run."""
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        before = text[: match.start()].rstrip("\n").splitlines()
        if before and _NO_RUN.search(before[-1]):
            continue
        blocks.append((text.count("\n", 0, match.start()) + 1, match.group(2)))
    return blocks


_DRIVER = textwrap.dedent(
    """
    import json, sys, traceback
    blocks = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__main__"}
    for line, code in blocks:
        try:
            exec(compile(code, f"{sys.argv[2]}:{line}", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"block at {sys.argv[2]}:{line} failed", file=sys.stderr)
            sys.exit(1)
    """
)


def test_no_run_marker_needs_a_reason():
    text = "<!-- no-run: needs a TF Serving server -->\n```python\nx\n```\n"
    assert python_blocks(text) == []
    assert python_blocks("```python\nx = 1\n```\n") == [(1, "x = 1\n")]


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_python_blocks_run(doc, tmp_path):
    blocks = python_blocks((ROOT / doc).read_text())
    assert blocks, f"{doc} has no Python block to run"
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "driver.py").write_text(_DRIVER)
    result = subprocess.run(
        [sys.executable, "driver.py", "blocks.json", doc],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONPATH": str(ROOT),
        },
    )
    assert result.returncode == 0, result.stderr[-4000:]
