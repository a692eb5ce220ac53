"""The documentation runs as written, and says what the release holds.

Every Python block of README.md, export/README.md and every page of the
documentation site (docs/**/*.md) runs. The blocks of one file run in order
in one fresh interpreter, sharing one namespace, in an empty working
directory: a block may use what an earlier block of the same file defined,
and nothing else. A block preceded by a line `<!-- no-run: reason -->` (a TF
Serving client, say) is skipped.
"""

import importlib
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

# The pages' blocks export SavedModel and TFLite files: TensorFlow.
pytestmark = pytest.mark.tf_only

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [
    "README.md",
    "export/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NO_RUN = re.compile(r"<!--\s*no-run:\s*(\S.*?)\s*-->\s*$")

# The modules the site's API reference documents (mkdocs.yml, docs/api/).
API_MODULES = [
    "kerasnorm.layers",
    "kerasnorm.export",
    "kerasnorm.export.litert",
    "kerasnorm.training",
    "kerasnorm.migrate",
    "kerasnorm.legacy.layers",
]

QUICK_START = [
    'python3 -m pip install -e ".[examples,qat]" && kerasnorm demo',
    'python3 -m pip install -e ".[test]" && python3 -m pytest -q -n 2',
]


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


def _pages_with_blocks():
    return [doc for doc in DOCS if python_blocks((ROOT / doc).read_text())]


# Runs a page's blocks in one namespace, as a reader pastes them. After each
# block what it left (the modules it imported, its models) is frozen out of
# later garbage collections, as the test processes freeze their imports
# (tests/conftest.py): the TFLite converter collects at every conversion.
_DRIVER = textwrap.dedent(
    """
    import gc, json, sys, traceback
    blocks = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__main__"}
    for line, code in blocks:
        try:
            exec(compile(code, f"{sys.argv[2]}:{line}", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"block at {sys.argv[2]}:{line} failed", file=sys.stderr)
            sys.exit(1)
        gc.freeze()
    """
)


def test_no_run_marker_needs_a_reason():
    text = "<!-- no-run: needs a TF Serving server -->\n```python\nx\n```\n"
    assert python_blocks(text) == []
    assert python_blocks("```python\nx = 1\n```\n") == [(1, "x = 1\n")]
    # Without a reason the marker is no marker: the block runs.
    assert python_blocks("<!-- no-run: -->\n```python\nx = 1\n```\n") == [
        (2, "x = 1\n")
    ]


def test_every_page_is_collected():
    # The guides whose blocks once never ran are among the pages that run.
    pages = _pages_with_blocks()
    for page in ("README.md", "docs/guides/training.md", "docs/guides/migration.md"):
        assert page in pages
    assert len(DOCS) > 20


@pytest.mark.slow
@pytest.mark.parametrize("doc", _pages_with_blocks())
def test_python_blocks_run(doc, tmp_path):
    blocks = python_blocks((ROOT / doc).read_text())
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


def test_readme_quick_start_commands_word_for_word():
    readme = (ROOT / "README.md").read_text()
    bash_blocks = [m.group(2).strip() for m in _FENCE.finditer(readme)]
    for command in QUICK_START:
        assert command in bash_blocks


def test_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def _public_objects(module_name):
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", "") == module_name
    ]
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isroutine(obj):
            yield f"{module_name}.{name}", obj
        if inspect.isclass(obj):
            # Methods and properties the class itself defines (inherited
            # Keras ones are documented by Keras).
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property) or inspect.isroutine(value):
                    yield f"{module_name}.{name}.{attr}", value


@pytest.mark.parametrize("module_name", API_MODULES)
def test_documented_names_have_docstrings(module_name):
    missing = [
        name
        for name, obj in _public_objects(module_name)
        if not (inspect.getdoc(obj) or "").strip()
    ]
    assert missing == [], f"public names without a docstring: {missing}"


def doctest_lines_outside_examples(docstring):
    """The `>>>` lines of a docstring that are not in a Google `Examples:` section.

    mkdocstrings renders only an `Examples:` section's doctest lines as
    code; anywhere else, an unindented one under a bare `Example:` (an
    admonition) included, Markdown reads `>>>` as three nested blockquotes
    and runs the lines together.
    """
    stray = []
    section = None
    for line in docstring.splitlines():
        if line.strip() and not line[0].isspace():
            section = line.strip()
        if line.lstrip().startswith(">>>") and (
            section != "Examples:" or not line[0].isspace()
        ):
            stray.append(line.strip())
    return stray


def test_doctest_lines_outside_examples_are_found():
    good = "Summary.\n\nExamples:\n    >>> 1 + 1\n    2\n\nArgs:\n    x: y.\n"
    assert doctest_lines_outside_examples(good) == []
    # The form the API pages once showed as nested blockquotes.
    bare = "Summary.\n\nExample:\n\n>>> 1 + 1\n2\n"
    assert doctest_lines_outside_examples(bare) == [">>> 1 + 1"]
    admonition = "Summary.\n\nExample:\n    >>> 1 + 1\n"
    assert doctest_lines_outside_examples(admonition) == [">>> 1 + 1"]


@pytest.mark.parametrize("module_name", API_MODULES)
def test_api_examples_render_as_code(module_name):
    stray = {
        name: lines
        for name, obj in _public_objects(module_name)
        if (lines := doctest_lines_outside_examples(inspect.getdoc(obj) or ""))
    }
    assert stray == {}, f"doctest lines outside an Examples: section: {stray}"


def test_version_is_the_installed_metadata():
    import importlib.metadata

    import kerasnorm

    assert importlib.metadata.version("kerasnorm") == kerasnorm.__version__


def test_license_is_the_apache_license_the_metadata_declares():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject
    assert 'license-files = ["LICENSE"]' in pyproject
