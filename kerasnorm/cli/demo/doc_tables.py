"""The demo's tables in the documentation, written from a run's report.

README.md and docs/install.md show `kerasnorm demo`'s tables as the demo
writes them to `report.md`, between markers:

    <!-- demo-table conv_net -->
    ...
    <!-- /demo-table -->

    python -m kerasnorm.cli.demo.doc_tables kerasnorm-demo/report.json \\
        README.md docs/install.md

rewrites each block from the run's `report.json` (the run's line, the
model's summary and its table; a file may hold any of the models).
tests/test_doc_tables.py fails on a table whose columns, formats or
parity checks (criterion and default tolerance per mode) are not the ones
the code writes today.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys

from kerasnorm.cli.demo.report import KERAS_FORMAT
from kerasnorm.cli.demo.report import QAT_FORMAT
from kerasnorm.cli.demo.report import SAVED_MODEL_FORMAT
from kerasnorm.cli.demo.report import TFLITE_MODES
from kerasnorm.cli.demo.report import ModelReport
from kerasnorm.cli.demo.report import Row
from kerasnorm.cli.demo.report import summary_lines
from kerasnorm.cli.demo.report import table_lines
from kerasnorm.cli.demo.report import tflite_format

_BLOCK = re.compile(r"(<!-- demo-table (\w+) -->\n)(.*?)(<!-- /demo-table -->)", re.S)
# The demo's rows: the format column and the quantize mode it is checked
# in ("reference": the Keras model itself, not checked).
FORMATS = {
    KERAS_FORMAT: "reference",
    SAVED_MODEL_FORMAT: None,
    **{tflite_format(mode): mode for mode in TFLITE_MODES},
    QAT_FORMAT: "int8",
}


def block(report, meta, date) -> str:
    """The text between a model's markers: where the figures come from,
    the model's summary and its table."""
    stamp = (
        f"From `kerasnorm demo` (seed {meta['seed']}"
        + (", `--quick`" if meta["quick"] else "")
        + f") on {date}, TensorFlow {meta['tensorflow']}, Keras "
        f"{meta['keras']}; written by `python -m kerasnorm.cli.demo.doc_tables`."
    )
    lines = [stamp, "", *summary_lines(report), "", *table_lines(report)]
    return "\n".join(lines) + "\n"


def update(text, document, date) -> str:
    """`text` with every demo-table block rewritten from `document` (a
    `report.json`); a block naming a model the report lacks is an error."""
    reports = {m["name"]: _model(m) for m in document["models"]}

    def replace(match):
        name = match.group(2)
        if name not in reports:
            raise ValueError(f"the report has no model {name!r}: {sorted(reports)}")
        body = block(reports[name], document, date)
        return match.group(1) + body + match.group(4)

    return _BLOCK.sub(replace, text)


def _model(data):
    data = dict(data)
    data["rows"] = [Row(**row) for row in data["rows"]]
    return ModelReport(**data)


def tables(text) -> dict[str, list[list[str]]]:
    """`{model: rows}` of each demo-table block, each row its cells."""
    found = {}
    for match in _BLOCK.finditer(text):
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in match.group(3).splitlines()
            if line.startswith("|") and not set(line) <= set("|- ")
        ]
        found[match.group(2)] = rows
    return found


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        document = json.load(f)
    # The day the report was written: the run's.
    date = datetime.date.fromtimestamp(os.path.getmtime(argv[0])).isoformat()
    for path in argv[1:]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = update(text, document, date)
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"{path}: {len(tables(new))} table(s) written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
