"""export/bench_ondevice.py: the `--quick` run end to end in a subprocess,
and its argument check in process.

The quick run trains for one epoch on a few samples, so its accuracies say
nothing; what must hold is what holds for any model: kerasnorm's float32
file has builtin ops only and matches Keras to float32 rounding (two graphs,
other kernels: 1e-4 of the output scale is far above rounding at this size
and far below any wrong op), every table row is in both the JSON and the
Markdown, every mode of `QUANTIZE_MODES` is measured, and the report names
its machine. Run from another folder: the package is found through
PYTHONPATH alone.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# 140 s of CI's slow tier: run on demand (-m exhaustive); the script's
# layout and --help are checked by test_layout.py in every run.
@pytest.mark.slow
@pytest.mark.exhaustive
def test_quick_run_writes_consistent_tables(tmp_path):
    from kerasnorm.export import QUANTIZE_MODES

    result = subprocess.run(
        [sys.executable, "-m", "export.bench_ondevice", "--quick", "--out", tmp_path],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "bench_ondevice.json") as f:
        report = json.load(f)
    markdown = (tmp_path / "bench_ondevice.md").read_text()

    # The machine and the stack, with the tables (benchmarks/machine.py).
    machine = report["machine"]
    assert machine["cores"] == os.cpu_count()
    assert machine["onednn_in_effect"] in (True, False)
    for line in ("cpu: ", "oneDNN: TF_ENABLE_ONEDNN_OPTS", "stack: Python "):
        assert line in markdown and line in report["header"], line
    assert f"Keras {machine['Keras']}" in markdown

    sides = report["side_by_side"]
    assert sides[0]["model"] == "conv + GroupNorm"
    assert any("LayerNormLSTM" in row["model"] for row in sides)
    for row in sides:
        mine = row["kerasnorm float32"]
        assert mine["flex"] == [], row["model"]
        assert mine["max_rel"] < 1e-4, row["model"]
        assert mine["ms"] > 0
        assert "error" not in row["kerasnorm int8"], row["model"]
        assert f"| {row['model']} | kerasnorm | yes |" in markdown
    # Keras' own export of a rolled recurrent layer needs Flex ops.
    lstm = next(row for row in sides if "LayerNormLSTM" in row["model"])
    assert lstm["keras float32"]["flex"]

    modes = report["modes"]
    assert len(modes) == 2
    for row in modes:
        assert row["float32"]["rms_rel"] < 1e-4, row["model"]
        assert row["int8"]["unrolled"] in ("by hand", "by to_tflite")
        # Every mode of the library's table, measured.
        for mode in QUANTIZE_MODES:
            assert "accuracy" in row[mode or "float32"], (row["model"], mode)
            assert f"| {row['model']} | {mode or 'float32'} |" in markdown

    # int8 against float32 per norm: the fast int8 file runs as one XNNPACK
    # partition where the full-integer file (int8_io) is split, at an error
    # of its order.
    fast = report["fast_int8"]
    assert len(fast) == 3
    for row in fast:
        assert row["float32"]["partitions"] == 1, row["model"]
        assert row["int8"]["partitions"] > 1, row["model"]
        assert row["fast int8"]["partitions"] == 1, row["model"]
        assert row["fast int8"]["undelegated"] == {}, row["model"]
        assert row["fast int8"]["rms_rel"] < 2 * row["int8"]["rms_rel"] + 0.01
        assert row["fast int8"]["size_ratio"] < 1
        # The norm statistics stay in float (ExportResult.float_ops).
        assert row["fast int8"]["float_ops"], row["model"]
        assert f"| {row['model']} | " in markdown
        in_float = ", ".join(row["fast int8"]["float_ops"])
        assert f"in float: {in_float}" in markdown

    # Streaming: every mode at every length, the float step exact.
    streaming = report["streaming_int8"]
    modes = ("float32", "dynamic", "int8", "int16x8", "int8, float state")
    for mode in modes:
        for length in (8, 28):
            assert f"rms@{length}" in streaming[mode], mode
        assert f"| {mode} | " in markdown
    assert streaming["float32"]["rms@28"] < 1e-4


def test_repeats_below_one_is_refused(capsys):
    from export import bench_ondevice

    with pytest.raises(SystemExit):
        bench_ondevice.main(["--repeats", "0"])
    assert "--repeats must be at least 1. Received: 0" in capsys.readouterr().err
