"""The benchmark packages (benchmarks/, export/): public names only, no
`sys.path` edits, every file and command they or their docs name exists,
and every script's command line answers `--help`."""

import ast
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGES = ("benchmarks", "export")
# Pages whose every repository path must exist; every page's commands must.
DOCS = ("docs/benchmarks.md", "export/README.md", "docs/contributing.md")
# The modules of kerasnorm a benchmark may import from: the documented ones.
PUBLIC = {
    "kerasnorm",
    "kerasnorm.export",
    "kerasnorm.export.litert",
    "kerasnorm.norms",
    "kerasnorm.recurrent",
    "kerasnorm.blocks",
    "kerasnorm.training",
    "kerasnorm.layers",
}


def _sources():
    paths = sorted(p for name in PACKAGES for p in (ROOT / name).rglob("*.py"))
    assert paths
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def _kerasnorm_imports(tree):
    """(line, module, name or None) for each import of a kerasnorm module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kerasnorm":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] == "kerasnorm":
                for alias in node.names:
                    yield node.lineno, node.module, alias.name


def private_uses(source):
    """What in `source` reaches past kerasnorm's public surface or edits
    `sys.path`, as strings."""
    found = []
    tree = ast.parse(source)
    for line, module, name in _kerasnorm_imports(tree):
        if name is not None and f"{module}.{name}" in PUBLIC:
            continue  # `from kerasnorm.export import litert`
        if module not in PUBLIC:
            found.append(f"line {line}: import of {module}")
        elif name is not None:
            public = getattr(importlib.import_module(module), "__all__", None)
            if name.startswith("_") or (public is not None and name not in public):
                found.append(f"line {line}: {module}.{name} is not public")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"line {node.lineno}: sys.path")
    return found


PLANTED = """
import sys
import kerasnorm
import kerasnorm._timing
from kerasnorm.cli.demo import load_digits
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export import options
from kerasnorm.export import fold
from kerasnorm.export.litert.convert import stderr_captured
sys.path.insert(0, "..")
"""


def test_the_scan_catches_planted_uses():
    found = private_uses(PLANTED)
    expected = [
        "import of kerasnorm._timing",
        "import of kerasnorm.cli.demo",
        "kerasnorm.export.options is not public",
        "kerasnorm.export.fold is not public",
        "import of kerasnorm.export.litert.convert",
        "sys.path",
    ]
    for use in expected:
        assert any(use in line for line in found), (use, found)
    assert len(found) == len(expected), found


# The scripts allowed past the public surface, and why.
PAST_THE_SURFACE = {
    # Runs a bundle's own `.tflite` as the engine runs it: the model
    # section and the start token the engine prepends, read from the bundle.
    "export/real_chat.py",
    # Measures each lever of the TFLite writer's keras-hub decoder lowering
    # by tracing with that lever left out (the "before" file).
    "export/bench_decoders.py",
    # Plants outlier channels exactly as smoothing moves them (the same
    # rescaling, by the factor 30 instead of a calibrated one), so the float
    # model is unchanged, and reads the file's tensors one by one.
    "benchmarks/bench_smoothing.py",
    # Judges a float file with the verifier's own float64 rebuild and
    # rounding factor, so that the fuzzer and the export agree on "wrong".
    "export/fuzz_export.py",
    # Times the generic keras-hub step of each family: the step written
    # and run by itself, not through `to_litert_lm`.
    "export/bench_hub_step.py",
    # Measures the memory of each stage of `to_litert_lm` by wrapping the
    # functions that run it (tracing, saving, converting, checking).
    "export/bench_export_memory.py",
    # Writes the random-weight benchmark model's quantized files without
    # `to_litert_lm`'s check, whose agreement rule its near-tied logits
    # fail by chance (the trained model's quality is measured apart).
    "export/bench_generation.py",
    # The real-checkpoint measurements: a file the check would refuse is
    # written with the generative modes' thresholds lowered and judged
    # afterwards (litert-torch's files are read with the same runner);
    # the error sources are found by rounding one kind of product at a
    # time in Keras, with the weights stage's own rounding and the norm
    # sites smoothing uses.
    "export/bench_real_models.py",
    # Runs a speculative bundle in the engine on the toy chat's prompts
    # with and without its drafter (the export's own run takes two plain
    # sentences), judged by the engine module's comparison.
    "export/bench_speculative.py",
    # Writes an embedder's int4 encoder with one group of products at a
    # time kept at int8 (the weights pass's per-product int8), beside the
    # export's own file, and runs each as the export's check does.
    "export/embedder_int4_error.py",
    "export/real_quality.py",
    "export/int4_error.py",
    "export/real_error_sources.py",
}


@pytest.mark.tf_only
def test_benchmarks_use_public_names_only():
    found = [
        f"{path}: {use}"
        for path, source in _sources().items()
        if path not in PAST_THE_SURFACE
        for use in private_uses(source)
    ]
    assert not found, "\n".join(found)


# A repository path: a top-level folder of the repository, then a file.
_PATH = re.compile(
    r"(?<![\w./-])((?:benchmarks|export|examples|kerasnorm|docs|tests)/[\w/.-]*\w\.(?:py|md))"
)
_COMMAND = re.compile(r"python3? -m ((?:benchmarks|export)\.\w+)")
_SCRIPT = re.compile(r"python3? ((?:benchmarks|export)/\w+\.py)")


def _pages():
    pages = [ROOT / "README.md", ROOT / "export/README.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in pages}


def test_every_file_and_command_named_exists():
    missing = []
    pages = _pages()
    with_paths = {**_sources(), **{doc: pages[doc] for doc in DOCS}}
    for where, text in with_paths.items():
        for path in _PATH.findall(text):
            if not (ROOT / path).exists():
                missing.append(f"{where}: {path}")
    for where, text in {**_sources(), **pages}.items():
        for module in _COMMAND.findall(text):
            if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                missing.append(f"{where}: python -m {module}")
        for script in _SCRIPT.findall(text):
            missing.append(f"{where}: `python {script}` (run `python -m` instead)")
    assert not missing, "\n".join(missing)


def test_the_path_scan_sees_paths_and_commands():
    text = "see benchmarks/timing.py and `python -m export.bench_ondevice --quick`"
    assert _PATH.findall(text) == ["benchmarks/timing.py"]
    assert _COMMAND.findall(text) == ["export.bench_ondevice"]
    assert _SCRIPT.findall("python export/bench_qat.py") == ["export/bench_qat.py"]


SCRIPTS = sorted(
    f"{p.parent.name}.{p.stem}"
    for name in PACKAGES
    for p in (ROOT / name).glob("*.py")
    if p.stem.startswith(("bench_", "profile_"))
)


def test_the_scripts_are_found():
    assert "export.bench_ondevice" in SCRIPTS
    assert "benchmarks.bench_norms" in SCRIPTS
    assert {"benchmarks.profile_training", "export.bench_qat"} <= set(SCRIPTS)


# Runs in one child process (TensorFlow loads once): each script's main as
# `python -m` would run it, with `--help`; prints {module: exit code, usage}.
_HELP = """
import contextlib, io, json, runpy, sys
found = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = None
    except SystemExit as stop:
        code = stop.code
    found[module] = [code, out.getvalue().splitlines()[:1]]
print(json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.tf_only
def test_each_command_line_answers_help(tmp_path):
    """`python -m <module> --help` of every script, from another folder: the
    packages are found through PYTHONPATH, nothing depends on the working
    directory, every import resolves and every parser builds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", _HELP, *SCRIPTS],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(found) == SCRIPTS
    for module, (code, usage) in found.items():
        assert code == 0, (module, code, usage)
        assert usage and usage[0].startswith("usage: "), (module, usage)
