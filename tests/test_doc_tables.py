"""The figure tables of the docs say what the code does today (issue 34
item 4): the demo's tables in README and Install are the demo's own
(`kerasnorm.cli.demo.doc_tables`), with its columns, formats and parity
checks; no pipe table sits in a code block, where it would not render."""

import pathlib
import re

import pytest

from kerasnorm.cli.demo import doc_tables
from kerasnorm.cli.demo.report import TABLE_HEADER
from kerasnorm.cli.demo.report import ModelReport
from kerasnorm.cli.demo.report import Row

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO_PAGES = {"README.md": ["conv_net"], "docs/install.md": ["conv_net", "ln_lstm"]}


def problems(text):
    """What in the demo tables of `text` the code no longer writes."""
    pytest.importorskip("tensorflow")
    from kerasnorm.export.options.modes import MODES

    found = []
    for model, rows in doc_tables.tables(text).items():
        if not rows or tuple(rows[0]) != TABLE_HEADER:
            found.append(f"{model}: columns {rows[:1]}, the demo writes {TABLE_HEADER}")
            continue
        column = {name: i for i, name in enumerate(TABLE_HEADER)}
        for row in rows[1:]:
            fmt = row[column["format"]]
            if fmt not in doc_tables.FORMATS:
                found.append(f"{model}: format {fmt!r} is not one the demo writes")
                continue
            mode = doc_tables.FORMATS[fmt]
            if mode == "reference":
                continue
            want = f"{MODES[mode].criterion} ≤ {MODES[mode].tolerance:g} vs "
            check = row[column["parity check"]]
            if not check.startswith(want):
                found.append(f"{model}: {fmt} says {check!r}, the exporter {want!r}")
    return found


@pytest.mark.parametrize("page", sorted(DEMO_PAGES))
def test_the_demo_tables_are_the_demos(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert sorted(doc_tables.tables(text)) == sorted(DEMO_PAGES[page])
    assert problems(text) == []
    # Each carries where it came from.
    for match in re.finditer(r"<!-- demo-table \w+ -->\n(.*)\n", text):
        assert match.group(1).startswith("From `kerasnorm demo` (seed 0) on 20")


def _report():
    row = dict(
        test_accuracy=0.99,
        size_bytes=2048,
        latency_ms=0.05,
        reference="Keras",
        max_abs_diff=1e-5,
        max_rel_diff=1e-6,
        rms_rel_diff=1e-7,
        checked_on="360 test digits",
    )
    rows = [
        Row("m.keras", "Keras (eager call)", 0.99, 4096, 1.0),
        Row("m.tflite", "TFLite float32", criterion="max", tolerance=1e-4, **row),
        Row("m.int8.tflite", "TFLite int8", criterion="rms", tolerance=0.1, **row),
    ]
    return ModelReport(
        "m", "a model", 10, 2, [1.0, 0.5], {"train": 1.0}, [], [], rows, 3.0
    )


def test_a_stale_table_is_caught():
    document = {"seed": 0, "quick": False, "tensorflow": "2.x", "keras": "3.x"}
    text = doc_tables.block(_report(), document, "2026-12-02")
    page = f"<!-- demo-table m -->\n{text}<!-- /demo-table -->\n"
    assert problems(page) == []
    assert problems(page.replace("rms ≤ 0.1", "max ≤ 0.05")) == [
        "m: TFLite int8 says 'max ≤ 0.05 vs Keras on 360 test digits: ok', the "
        "exporter 'rms ≤ 0.1 vs '"
    ]
    assert (
        "format 'TFLite int4'"
        in problems(page.replace("TFLite int8", "TFLite int4"))[0]
    )
    assert "columns" in problems(page.replace("| XNNPACK", "| delegate"))[0]


def test_update_rewrites_only_the_blocks():
    import dataclasses

    document = {
        "seed": 0,
        "quick": False,
        "tensorflow": "2.x",
        "keras": "3.x",
        "models": [dataclasses.asdict(_report())],
    }
    page = "intro\n<!-- demo-table m -->\nSTALE\n<!-- /demo-table -->\nafter\n"
    new = doc_tables.update(page, document, "2026-12-02")
    assert new.startswith(
        "intro\n<!-- demo-table m -->\nFrom `kerasnorm demo` (seed 0)"
    )
    assert new.endswith("<!-- /demo-table -->\nafter\n") and "STALE" not in new
    assert [row[1] for row in doc_tables.tables(new)["m"][1:]] == [
        "Keras (eager call)",
        "TFLite float32",
        "TFLite int8",
    ]
    with pytest.raises(ValueError, match="no model 'other'"):
        doc_tables.update(page.replace(" m -->", " other -->"), document, "x")


def _markdown_pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: p.name)
def test_no_pipe_table_inside_a_code_block(page):
    text = page.read_text(encoding="utf-8")
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        lines = block.splitlines()
        rules = [line for line in lines if re.match(r"^\|[-| :]+\|$", line.strip())]
        assert not rules, f"{page.name}: a table inside a code block:\n{block[:300]}"
