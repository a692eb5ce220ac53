"""benchmarks/rerun.py: a benchmark's child processes find the package from
any working directory."""

import importlib.util
import os
import subprocess
import sys

import pytest

from benchmarks import rerun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_child_command_runs_the_callers_module():
    spec = importlib.util.find_spec("benchmarks.machine")
    assert rerun.command(spec, "--child", 3) == [
        sys.executable,
        "-m",
        "benchmarks.machine",
        "--child",
        "3",
    ]


def test_a_script_run_by_path_is_told_to_run_as_a_module():
    with pytest.raises(RuntimeError, match=r"python -m benchmarks\.bench_norms"):
        rerun.command(None, "--child")


def test_the_environment_puts_the_root_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = rerun.environment(TF_ENABLE_ONEDNN_OPTS="0")
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert env["PYTHONPATH"].split(os.pathsep) == [ROOT, "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert rerun.environment()["PYTHONPATH"] == ROOT


def test_a_child_finds_the_package_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = subprocess.run(
        [sys.executable, "-c", "import benchmarks.rerun as r; print(r.ROOT)"],
        env=rerun.environment(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == ROOT
