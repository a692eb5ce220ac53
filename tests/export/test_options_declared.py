"""Each export option is declared once (`options.declared`: name, default,
documentation, flag): the doors' signatures and docstrings, the format
table's option lists and `kerasnorm export`'s flags are checked against the
declaration, and no module of `kerasnorm.export` but the format table
compares a format's name or an artifact's suffix."""

from __future__ import annotations

import argparse
import ast
import inspect
import pathlib
import re

import pytest

from kerasnorm.export import export
from kerasnorm.export import to_litert_lm
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.options.declared import OPTIONS
from kerasnorm.export.options.formats import FORMATS
from kerasnorm_cli import arguments

pytestmark = pytest.mark.tf_only

EXPORT = pathlib.Path(__file__).resolve().parents[2] / "kerasnorm" / "export"
DOORS = {
    "litert": to_tflite,
    "tf_saved_model": to_saved_model,
    "litert_lm": to_litert_lm,
}
# `kerasnorm export`'s flags that are no export option: the model and how
# it loads, where the artifacts go and which are written.
COMMAND_FLAGS = {
    "-h",
    "--help",
    "--out",
    "--import",
    "--no-safe-mode",
    "--format",
    "--saved-model",
    "--tflite",
    # The model's own: its LoRA adapters, loaded with it.
    "--lora-weights",
}


def _args_entries(doc):
    """`{name: text}` of a Google-style docstring's `Args:` section, the
    text's whitespace collapsed."""
    doc = inspect.cleandoc(doc)
    section = doc.split("\nArgs:\n", 1)[1].split("\nReturns:", 1)[0]
    entries = re.split(r"\n    (?=\w+: )", "\n" + section)
    found = {}
    for entry in entries:
        if entry.strip():
            name, text = entry.strip().split(": ", 1)
            found[name] = " ".join(text.split())
    return found


def door_differences(door, row):
    """How `door` (a format's shortcut) differs from the declarations of
    the options `row` takes; [] when it does not."""
    found = []
    params = list(inspect.signature(door).parameters.values())[2:]
    names = [p.name for p in params]
    if sorted(names) != sorted(row.options):
        found.append(f"options {sorted(names)} != {sorted(row.options)}")
    entries = _args_entries(door.__doc__)
    for param in params:
        option = OPTIONS.get(param.name)
        if option is None:
            found.append(f"{param.name}: not declared")
            continue
        if param.default != option.default:
            found.append(f"{param.name}: default {param.default!r}")
        if entries.get(param.name) != " ".join(option.doc_for(row.name).split()):
            found.append(f"{param.name}: docstring entry differs")
    return found


@pytest.mark.parametrize("name", sorted(DOORS))
def test_each_door_is_its_declaration(name):
    assert door_differences(DOORS[name], FORMATS[name]) == []


def test_the_check_catches_a_door_that_drifted():
    def drifted(model, path, *, fold=False, overwrite=False, verify_inputs=None):
        """A door.

        Args:
            model: the model.
            path: where.
            fold: fold nothing.
            overwrite: replace an existing file or version directory.
                Defaults to `False`.
            verify_inputs: inputs.
        """

    found = door_differences(drifted, FORMATS["tf_saved_model"])
    assert any(line.startswith("options") for line in found), found
    assert "fold: default False" in found
    assert "fold: docstring entry differs" in found
    assert "overwrite: docstring entry differs" not in found


def test_the_door_takes_every_declared_option_of_a_format():
    assert list(inspect.signature(export).parameters)[:3] == [
        "model",
        "path",
        "format",
    ]
    assert inspect.signature(export).parameters["format"].default == ("tf_saved_model")
    every = {name for row in FORMATS.values() for name in row.options}
    assert every == set(OPTIONS)


def _export_parser():
    parser = arguments.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["export"]


def flag_differences(parser):
    """How `kerasnorm export`'s flags differ from the declared options'."""
    declared = {o.flag: o for o in OPTIONS.values() if o.flag}
    declared |= {o.negation: o for o in OPTIONS.values() if o.negation}
    found = []
    seen = set()
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in COMMAND_FLAGS:
                continue
            option = declared.get(flag)
            if option is None:
                found.append(f"{flag}: no declared option")
                continue
            seen.add(flag)
            expected = (
                option.default if option.flag_default is None else (option.flag_default)
            )
            if isinstance(action, argparse._StoreTrueAction):
                expected = False
            if action.default != expected and action.default is not None:
                found.append(f"{flag}: default {action.default!r} != {expected!r}")
    found += [f"{flag}: declared, not a flag" for flag in set(declared) - seen]
    return found


def test_the_command_lines_flags_are_the_declared_options():
    assert flag_differences(_export_parser()) == []


def test_the_flag_check_catches_a_drifted_flag():
    parser = argparse.ArgumentParser()
    parser.add_argument("--export-dtype", default="float16")
    parser.add_argument("--quantise")
    found = flag_differences(parser)
    assert "--export-dtype: default 'float16' != 'float32'" in found
    assert "--quantise: no declared option" in found
    assert "--streaming: declared, not a flag" in found


def test_the_command_lines_copy_of_the_format_names_is_the_table():
    assert arguments.EXPORT_FORMATS == tuple(FORMATS)


FORMAT_WORDS = {"tflite", "saved_model", "litert", "tf_saved_model", ".tflite"}


def format_comparisons(source):
    """Where `source` compares a format's name or an artifact's suffix:
    `==` / `!=` / `in` against one, or `.endswith` of one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            words = [
                c.value
                for part in parts
                for c in ast.walk(part)
                if isinstance(c, ast.Constant) and c.value in FORMAT_WORDS
            ]
            if words:
                found.append(f"line {node.lineno}: compares {words[0]!r}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("endswith", "startswith")
        ):
            strings = [
                c.value
                for a in node.args
                for c in ast.walk(a)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            if any(s.startswith(".") and s != "." for s in strings):
                found.append(f"line {node.lineno}: {node.func.attr}{strings}")
    return found


def test_only_the_format_table_compares_format_names_or_suffixes():
    table = EXPORT / "options" / "formats.py"
    found = [
        f"{path.relative_to(EXPORT)}: {line}"
        for path in sorted(EXPORT.rglob("*.py"))
        if path != table
        for line in format_comparisons(path.read_text())
    ]
    assert found == []
    # The scan sees the table's own comparisons and planted ones.
    assert format_comparisons(table.read_text())
    planted = 'if options.format == "tflite" or path.endswith(".tflite"): pass'
    assert len(format_comparisons(planted)) == 2
