"""The command's front (`kerasnorm_cli`): help, `--version` and refusals
answer without importing Keras or TensorFlow, and no refusal writes
anything."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm_cli import command as main
from kerasnorm_cli.checks import parse
from kerasnorm_cli.exits import EXIT_OK
from kerasnorm_cli.exits import EXIT_USAGE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `python -m kerasnorm_cli ARGS` (sys.argv as the console script sees
# it) and reports the exit status and which heavy modules got imported.
PROBE = """
import json, runpy, sys
sys.argv = ["kerasnorm", *sys.argv[1:]]
try:
    runpy.run_module("kerasnorm_cli", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as stop:
    code = stop.code
heavy = ("keras", "tensorflow", "numpy", "jax", "torch", "kerasnorm")
print(json.dumps({"code": code, "imported": [m for m in heavy if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny .keras model and inputs files for it, in a folder of their own."""
    root = tmp_path_factory.mktemp("front")
    model = keras.Sequential(
        [keras.Input((4,), name="x"), keras.layers.Dense(3)], name="tiny"
    )
    model.save(root / "tiny.keras")
    np.save(root / "calib.npy", np.zeros((16, 4), "float32"))
    np.save(root / "wrong.npy", np.zeros((16, 5), "float32"))
    np.savez(root / "qat.npz", x=np.zeros((16, 4), "float32"), y=np.zeros(16))
    np.savez(root / "no_y.npz", x=np.zeros((16, 4), "float32"))
    np.savez(root / "two.npz", np.zeros((16, 4), "float32"), np.zeros((16, 4)))
    (root / "notes.txt").write_text("not a model\n")
    # A folder that passes the front's preset check (what it holds is
    # judged once loaded).
    (root / "assistant").mkdir()
    for name in ("config.json", "metadata.json"):
        (root / "assistant" / name).write_text("{}")
    for name in ("qat.npz", "calib.npy"):
        content = (root / name).read_bytes()
        (root / f"cut{name[-4:]}").write_bytes(content[: len(content) // 2])
    return root


def _probe(*args, cwd):
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("KERAS_BACKEND", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    *printed, last = result.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed), result.stderr


EXPORT = ["export", "tiny.keras", "--out", "out"]

# (arguments, exit status, what the answer must say); run in `files`.
FRONT_CASES = [
    (["--help"], EXIT_OK, "{demo,export,export-adapter,qat}"),
    (["export", "--help"], EXIT_OK, "random inputs"),
    (["qat", "--help"], EXIT_OK, "exit status:"),
    (["demo", "--help"], EXIT_OK, "exit status:"),
    (["--version"], EXIT_OK, f"kerasnorm {kerasnorm.__version__}"),
    ([*EXPORT, "--version", "0"], EXIT_USAGE, "argument --version: expected a"),
    ([*EXPORT, "--max-unroll-steps", "-5"], EXIT_USAGE, "--max-unroll-steps"),
    (["export", "missing.keras", "--out", "out"], EXIT_USAGE, "not found"),
    (["export", "notes.txt", "--out", "out"], EXIT_USAGE, "expected a .keras"),
    (["qat", "tiny.keras", "--data", "qat.npz", "--out", "o", "--epochs", "0"], 2, ""),
    ([*EXPORT, "--import", "missing.py"], EXIT_USAGE, "no such .py file"),
    ([*EXPORT, "--import", "my layers"], EXIT_USAGE, "neither a module name"),
    (["export", "--help"], EXIT_OK, "--no-safe-mode"),
    (["qat", "--help"], EXIT_OK, "--import MODULE"),
]


@pytest.mark.parametrize(("args", "status", "says"), FRONT_CASES)
def test_answers_without_keras_or_tensorflow(files, args, status, says):
    """`python -m kerasnorm_cli`: help, version and refusals import neither
    Keras nor TensorFlow (nor kerasnorm, whose `__init__` imports Keras)."""
    report, out, err = _probe(*args, cwd=files)
    assert report["code"] == status, err
    assert report["imported"] == [], report
    assert says in out + err
    assert not os.path.exists(files / "out") and not os.path.exists(files / "o")


def _workdir(files, tmp_path, monkeypatch):
    """`tmp_path` as the working directory, the model and inputs files in it."""
    monkeypatch.chdir(tmp_path)
    for name in os.listdir(files):
        os.symlink(files / name, tmp_path / name)


def test_the_probe_sees_keras_once_the_model_is_needed(files):
    """The probe above can fail: a refusal that needs the model (its input
    shape) imports Keras, and the probe reports it."""
    args = ["export", "tiny.keras", "--out", "out", "--calibration", "wrong.npy"]
    report, _, err = _probe(*args, cwd=files)
    assert report["code"] == EXIT_USAGE and "should have shape" in err
    assert {"keras", "tensorflow", "kerasnorm"} <= set(report["imported"])
    assert not os.path.exists(files / "out")


def _snapshot(directory):
    """Every entry under `directory`: its bytes (None: a folder) and mtime."""
    found = {}
    for root, folders, names in os.walk(directory):
        for name in folders + names:
            path = os.path.join(root, name)
            content = None
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    content = f.read()
            found[os.path.relpath(path, directory)] = (
                content,
                os.stat(path).st_mtime_ns,
            )
    return found


INT8 = ["--quantize", "int8", "--calibration", "calib.npy"]
# A generative file of tiny.keras, which has no tokenizer: a .tflite.
LM = ["--format", "litert_lm", "--max-sequence-length", "16"]

# (arguments after `export tiny.keras --out out`, what the refusal names).
EXPORT_REFUSALS = [
    (["--version", "0"], r"argument --version: expected a positive integer"),
    (["--version", "two"], r"argument --version: expected a positive integer"),
    (["--max-unroll-steps", "-5"], r"argument --max-unroll-steps: expected a pos"),
    (["--quantize", "int3"], r"argument --quantize: invalid choice: 'int3'"),
    (["--quantize", "int4"], r"--quantize int4 applies to --format litert_lm only"),
    (["--quantize", "int8"], r"--quantize int8 .* needs --calibration"),
    (["--quantize", "int16x8"], r"--quantize int16x8 .* needs --calibration"),
    (["--int8-io", "--tflite"], r"--int8-io needs --quantize int8"),
    (["--smooth", "--tflite"], r"--smooth needs --quantize int8 or dynamic"),
    (
        ["--smooth", "--quantize", "dynamic"],
        r"--smooth calibrates each norm's channels and needs --calibration",
    ),
    (
        [*INT8, "--streaming", "--max-unroll-steps", "8"],
        r"--max-unroll-steps applies to whole-sequence files; --streaming",
    ),
    (
        ["--quantize", "dynamic", "--max-unroll-steps", "8"],
        r"--max-unroll-steps applies to --quantize int8 / int16x8 only",
    ),
    (
        ["--quantize", "dynamic", "--export-dtype", "float16"],
        r"--export-dtype float16 applies to the SavedModel and the float",
    ),
    (["--calibration", "calib.txt"], r"--calibration should be a \.npy or \.npz"),
    (["--calibration", "gone.npy"], r"--calibration file not found: 'gone\.npy'"),
    (["--verify-data", "gone.npz"], r"--verify-data file not found: 'gone\.npz'"),
    (["--drafter", "assistant"], r"--drafter applies to --format litert_lm only"),
    ([*LM, "--drafter", "notes.txt"], r"--drafter is the keras-hub preset folder"),
    ([*LM, "--drafter", "out"], r"--drafter 'out' is a directory but not a keras"),
    (
        [*LM, "--drafter", "assistant", "--quantize", "dynamic"],
        r"--drafter: a bundle with a drafter is written in float32 .* no --quantize",
    ),
    (
        [*LM, "--drafter", "assistant"],
        r"--drafter goes into the \.litertlm bundle .* this export writes a \.tflite",
    ),
    (["--tflite"], r"out/tiny\.tflite already exist\(s\); pass --force"),
    (["--saved-model"], r"out/tiny/1 already exist\(s\); pass --force"),
]


@pytest.mark.parametrize(("extra", "message"), EXPORT_REFUSALS)
def test_export_refusals_name_the_flag_and_write_nothing(
    files, tmp_path, monkeypatch, capsys, extra, message
):
    """Refused before anything is written, by the front alone (`parse`):
    --out's listing, bytes and times are as they were."""
    _workdir(files, tmp_path, monkeypatch)
    (tmp_path / "out" / "tiny" / "1").mkdir(parents=True)
    (tmp_path / "out" / "tiny.tflite").write_bytes(b"an earlier export")
    before = _snapshot(tmp_path / "out")
    args, status = parse(["export", "tiny.keras", "--out", "out", *extra])
    assert (args, status) == (None, EXIT_USAGE)
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert _snapshot(tmp_path / "out") == before


QAT = ["qat", "tiny.keras", "--data", "qat.npz", "--out", "out", "--epochs", "1"]

# (arguments, what the refusal names): `qat` and `demo` in the front.
OTHER_REFUSALS = [
    ([*QAT[:-1], "0"], r"argument --epochs: expected a positive integer"),
    ([*QAT, "--batch-size", "0"], r"argument --batch-size: expected a positive"),
    ([*QAT, "--learning-rate=-1e-3"], r"argument --learning-rate: expected a "),
    ([*QAT, "--loss", "mean_squared_error", "--from-logits"], r"crossentropy --loss"),
    ([*QAT, "--verify-data", "gone.npy"], r"--verify-data file not found"),
    (["qat", "tiny.keras", "--data", "calib.npy", *QAT[4:]], r"--data should be a"),
    (QAT, r"out/tiny\.qat\.int8\.tflite already exists?\(?s?\)?; pass --force"),
    (["demo", "--out", "out"], r"--out 'out' is not empty \(3 entries\)"),
    (["demo", "--out", "out", "--epochs", "0"], r"argument --epochs: expected a"),
    (["export", "tiny.keras", "--out", "out/tiny.tflite"], r"is not a directory"),
]


@pytest.mark.parametrize(("args", "message"), OTHER_REFUSALS)
def test_qat_and_demo_refusals_write_nothing(
    files, tmp_path, monkeypatch, capsys, args, message
):
    _workdir(files, tmp_path, monkeypatch)
    (tmp_path / "out" / "tiny" / "1").mkdir(parents=True)
    (tmp_path / "out" / "tiny.tflite").write_bytes(b"an earlier export")
    (tmp_path / "out" / "tiny.qat.int8.tflite").write_bytes(b"an earlier QAT")
    before = _snapshot(tmp_path / "out")
    assert parse(args) == (None, EXIT_USAGE)
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert _snapshot(tmp_path / "out") == before


# Refusals that need the model: after it is loaded, before any file.
MODEL_REFUSALS = [
    (
        [*EXPORT, "--calibration", "wrong.npy"],
        r"--calibration for input 'x' should have shape \(N, 4\)",
    ),
    (
        [*EXPORT, "--tflite", "--verify-data", "two.npz"],
        r"--verify-data has 2 input array\(s\) but the model has 1 input\(s\)",
    ),
    (["qat", "tiny.keras", "--data", "no_y.npz", *QAT[4:]], r"no array `y`"),
    (
        ["qat", "tiny.keras", "--data", "cut.npz", *QAT[4:]],
        r"--data 'cut\.npz' could not be read \(BadZipFile",
    ),
    (
        [*EXPORT, "--calibration", "cut.npy"],
        r"--calibration 'cut\.npy' could not be read \(",
    ),
    (
        [*QAT, "--verify-data", "wrong.npy"],
        r"--verify-data for input 'x' should have shape",
    ),
]


@pytest.mark.parametrize(("args", "message"), MODEL_REFUSALS)
def test_inputs_that_do_not_fit_the_model_write_nothing(
    files, tmp_path, monkeypatch, capsys, args, message
):
    _workdir(files, tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not out.exists()


def test_an_out_that_takes_no_files_is_refused(files, tmp_path, monkeypatch, capsys):
    """The nearest existing folder of --out must take new files (as root,
    `os.access` says yes to everything, so it is told no here)."""
    _workdir(files, tmp_path, monkeypatch)
    import kerasnorm_cli.checks

    asked = []

    def no_access(path, mode):
        asked.append(path)
        return False

    monkeypatch.setattr(kerasnorm_cli.checks.os, "access", no_access)
    assert parse([*EXPORT[:-1], "new/deeper"]) == (None, EXIT_USAGE)
    assert asked == [str(tmp_path)]
    assert "--out 'new/deeper': cannot write in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [[*EXPORT], [*EXPORT, "--tflite"], [*EXPORT, "--quantize", "dynamic"], QAT],
)
def test_without_litert_a_tflite_is_refused_naming_the_extra(
    files, tmp_path, monkeypatch, capsys, args
):
    # Before: the .tflite jobs raised "No module named 'ai_edge_litert'".
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ai_edge_litert" else find_spec(name, *a),
    )
    _workdir(files, tmp_path, monkeypatch)
    assert parse(args) == (None, EXIT_USAGE)
    err = capsys.readouterr().err
    assert "needs LiteRT (the ai-edge-litert package)" in err
    assert 'pip install "kerasnorm[export]"' in err
    assert not os.path.exists(tmp_path / "out")
    # A SavedModel alone needs no LiteRT.
    saved_only = [*EXPORT, "--saved-model"]
    assert parse(saved_only)[0] is not None
