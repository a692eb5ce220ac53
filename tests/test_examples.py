"""Every script in examples/ runs end to end with --smoke and writes its outputs.

Each example is run as a user would run it (a subprocess, from the repository
root) with a tiny budget, so none can rot silently when the library changes.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

# The examples export and plot on the TensorFlow backend.
pytestmark = pytest.mark.tf_only

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_examples_found():
    assert len(SCRIPTS) >= 7, [p.name for p in SCRIPTS]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_example_smoke(script, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(out)],
        cwd=EXAMPLES.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    png = out / f"{script.stem}.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    numbers = json.loads((out / f"{script.stem}.json").read_text())
    assert numbers, f"{script.stem}.json is empty"
