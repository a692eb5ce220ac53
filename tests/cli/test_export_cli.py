"""`kerasnorm export` end to end: in-process, and as the installed command."""

import os
import pathlib
import re
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from kerasnorm_cli import command as main
from kerasnorm_cli.exits import EXIT_CONVERSION
from kerasnorm_cli.exits import EXIT_USAGE

# `kerasnorm export` writes SavedModel and TFLite files: TensorFlow.
pytestmark = pytest.mark.tf_only

ROOT = pathlib.Path(__file__).resolve().parents[2]

L = keras.layers


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            L.Conv2D(4, 3, use_bias=False, name="conv"),
            L.BatchNormalization(name="bn"),
            L.ReLU(),
            L.Flatten(),
            L.Dense(3),
        ],
        name="tiny",
    )
    model.layers[1].moving_mean.assign(np.full(4, 0.3, "float32"))
    path = root / "tiny.keras"
    model.save(path)
    calibration = root / "calib.npy"
    np.save(calibration, np.random.default_rng(0).random((40, 8, 8, 1), "float32"))
    return root, str(path), str(calibration)


def test_export_all_artifacts(files, capsys):
    root, model, calibration = files
    out = str(root / "out")
    argv = ["export", model, "--out", out, "--quantize", "int8"]
    code = main([*argv, "--tflite", "--saved-model", "--calibration", calibration])
    text = capsys.readouterr().out
    assert code == 0, text
    assert sorted(os.listdir(out)) == ["tiny", "tiny.int8.tflite", "tiny.tflite"]
    assert os.listdir(os.path.join(out, "tiny")) == ["1"]
    assert "1 folded, 0 kept" in text and "folded bn -> conv (after)" in text
    for row in ("tiny/1", "tiny.tflite", "tiny.int8.tflite"):
        assert any(
            line.startswith(row + " ") and line.endswith("ok")
            for line in (x.strip() for x in text.splitlines())
        ), text
    assert "artifact" in text and "latency/call" in text and "Calibrating" in text

    # A second run refuses to overwrite, before any work, and leaves the
    # files alone.
    stamp = os.stat(os.path.join(out, "tiny.tflite")).st_mtime_ns
    code = main([*argv, "--tflite", "--calibration", calibration])
    captured = capsys.readouterr()
    assert code == EXIT_USAGE and "pass --force" in captured.err
    assert "tiny.tflite" in captured.err and "tiny.int8.tflite" in captured.err
    assert captured.out == "", captured.out
    assert os.stat(os.path.join(out, "tiny.tflite")).st_mtime_ns == stamp
    assert main(["export", model, "--out", out, "--tflite", "--force"]) == 0
    assert "tiny.tflite" in capsys.readouterr().out


def test_no_fold_and_defaults(files, capsys):
    root, model, _ = files
    out = str(root / "plain")
    assert main(["export", model, "--out", out, "--no-fold"]) == 0
    text = capsys.readouterr().out
    assert "folded" not in text
    assert sorted(os.listdir(out)) == ["tiny", "tiny.tflite"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--quantize", "int8"], "needs --calibration"),
        (["--calibration", "bad.npy"], "should have shape"),
        (["--calibration", "x.txt"], "should be a .npy or .npz"),
    ],
)
def test_errors(files, capsys, extra, message):
    root, model, _ = files
    np.save(root / "bad.npy", np.zeros((4, 8, 8), "float32"))
    (root / "x.txt").write_text("")
    extra = [str(root / e) if e.endswith((".npy", ".txt")) else e for e in extra]
    code = main(["export", model, "--out", str(root / "err"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(root / "err")


def test_missing_model(tmp_path, capsys):
    code = main(["export", str(tmp_path / "nope.keras"), "--out", str(tmp_path)])
    assert code == 2 and "not found" in capsys.readouterr().err


def test_inputs_of_different_rank_int8(tmp_path, capsys):
    keras.utils.set_random_seed(1)
    image = keras.Input((8, 8, 1), name="image")
    sequence = keras.Input((5, 3), name="sequence")
    a = L.GlobalAveragePooling2D()(L.Conv2D(4, 3)(image))
    b = L.Flatten()(L.Dense(4)(sequence))
    model = keras.Model([image, sequence], L.Dense(3)(L.Concatenate()([a, b])))
    model.save(tmp_path / "two.keras")
    rng = np.random.default_rng(0)
    # Keys in the order the model does not have them, to show they go by name.
    np.savez(
        tmp_path / "calib.npz",
        sequence=rng.random((48, 5, 3), "float32"),
        image=rng.random((48, 8, 8, 1), "float32"),
    )
    np.savez(
        tmp_path / "held_out.npz",
        image=rng.random((20, 8, 8, 1), "float32"),
        sequence=rng.random((20, 5, 3), "float32"),
    )
    out = str(tmp_path / "out")
    argv = ["export", str(tmp_path / "two.keras"), "--out", out, "--quantize"]
    argv += ["int8", "--calibration", str(tmp_path / "calib.npz")]
    code = main([*argv, "--verify-data", str(tmp_path / "held_out.npz")])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "Calibrating int8 on 48 samples" in text
    assert re.search(r"^two\.int8\.tflite .* ok\s*$", text, re.M), text
    assert os.listdir(out) == ["two.int8.tflite"]
    np.save(tmp_path / "bad.npy", np.zeros((3, 8, 8, 1), "float32"))
    code = main([*argv, "--force", "--verify-data", str(tmp_path / "bad.npy")])
    assert code == EXIT_USAGE
    assert "--verify-data" in capsys.readouterr().err


@keras.saving.register_keras_serializable(package="test_export_cli")
class Determinant(L.Layer):
    def call(self, x):
        return keras.ops.linalg.det(keras.ops.reshape(x, (-1, 2, 2)))


def test_conversion_failure_has_its_own_exit_code(tmp_path, capsys):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, Determinant(name="det")(L.Dense(4)(inputs)))
    model.save(tmp_path / "det.keras")
    out = str(tmp_path / "out")
    code = main(["export", str(tmp_path / "det.keras"), "--out", out, "--tflite"])
    captured = capsys.readouterr()
    assert code == EXIT_CONVERSION == 3
    assert re.search(
        r"det\.tflite: TFLite builtins cannot express MatrixDeterminant, used by "
        r"layer 'det'",
        captured.err,
    )
    assert "conversion failed" in captured.out
    assert not os.path.exists(os.path.join(out, "det.tflite"))


# Lines TensorFlow, absl and the converter print to stderr.
# ("XNNPACK delegate": LiteRT's INFO line; the command's own table names
# XNNPACK partitions on stdout.)
_LOG_LINE = re.compile(
    r"^[IWEF]\d{4} |cuInit|absl::|absl:|oneDNN|XNNPACK delegate|deprecated", re.M
)


def _command(*args, cwd):
    """Run the `kerasnorm` command as installed, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, kerasnorm_cli; sys.exit(kerasnorm_cli.main())",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_command_prints_no_tensorflow_logs(files):
    root, model, calibration = files
    result = _command("--help", cwd=root)
    assert result.returncode == 0 and "export" in result.stdout
    assert not _LOG_LINE.search(result.stdout + result.stderr), result.stderr
    out = str(root / "quiet")
    args = ["export", model, "--out", out, "--quantize", "int8", "--tflite"]
    result = _command(*args, "--calibration", calibration, cwd=root)
    assert result.returncode == 0, result.stderr
    assert not _LOG_LINE.search(result.stdout + result.stderr), result.stderr
    assert "tiny.int8.tflite" in result.stdout
    # Errors still reach the user.
    result = _command(*args, "--calibration", calibration, cwd=root)
    assert result.returncode == EXIT_USAGE and "--force" in result.stderr
    # --verbose lets the converter's log through.
    result = _command(
        *args, "--calibration", calibration, "--force", "--verbose", cwd=root
    )
    assert result.returncode == 0 and _LOG_LINE.search(result.stderr)


@pytest.mark.slow
def test_import_kerasnorm_is_enough_to_load_its_layers(tmp_path):
    import kerasnorm

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    x = kerasnorm.RMSNorm()(kerasnorm.LayerNorm()(L.Dense(4)(inputs)))
    keras.Model(inputs, x).save(tmp_path / "m.keras")
    code = (
        "import keras, kerasnorm\n"
        "m = keras.saving.load_model('m.keras')\n"
        "print(sorted(type(l).__name__ for l in m.layers))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "'LayerNorm'" in result.stdout and "'RMSNorm'" in result.stdout


def _damaged(files, tmp_path, how):
    """A copy of the tiny model's .keras file, damaged as `how` says."""
    import zipfile

    content = pathlib.Path(files[1]).read_bytes()
    path = tmp_path / f"{how}.keras"
    if how == "truncated":
        path.write_bytes(content[: len(content) // 2])
    elif how == "not_a_zip":
        path.write_bytes(b"this is not a model\n" * 10)
    else:
        with zipfile.ZipFile(files[1]) as source:
            members = {n: source.read(n) for n in source.namelist()}
        if how == "bad_config":
            members["config.json"] = b"{ not json"
        elif how == "no_weights":
            del members["model.weights.h5"]
        elif how == "bad_weights":
            members["model.weights.h5"] = b"\x89HDF\r\n\x1a\n" + b"\0" * 64
        with zipfile.ZipFile(path, "w") as target:
            for name, data in members.items():
                target.writestr(name, data)
        if how == "bad_checksum":
            # Flip one byte inside the (stored, uncompressed) config member.
            raw = bytearray(path.read_bytes())
            at = raw.index(b'"class_name"')
            raw[at + 2] ^= 0x20
            path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", r"is not a valid \.keras archive \(not a zip file"),
        ("not_a_zip", r"is not a valid \.keras archive \(not a zip file"),
        ("bad_checksum", r"damaged \.keras archive: its member 'config\.json'"),
        ("bad_config", r"its config\.json is not valid JSON"),
        ("no_weights", r"it has no model\.weights\.h5"),
        ("bad_weights", r"could not be loaded \("),
    ],
)
def test_damaged_model_file(files, tmp_path, capsys, how, message):
    path = _damaged(files, tmp_path, how)
    before = path.read_bytes()
    out = tmp_path / "out"
    code = main(["export", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert re.search(message, err), err
    assert str(path) in err and "File not found" not in err
    assert not out.exists() and path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_the_table_says_what_the_check_ran_on(files, capsys):
    """No data: the row says "random inputs" and a hint names --verify-data;
    with --calibration, the row names it and no hint is printed."""
    root, model, calibration = files
    out = str(root / "checked")
    assert main(["export", model, "--out", out, "--tflite"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("tiny.tflite"))
    assert re.search(r"\s\d+ random inputs\s", row), text
    assert "pass --verify-data FILE.npy|.npz" in text.splitlines()[-1]
    argv = ["export", model, "--out", out, "--tflite", "--force"]
    assert main([*argv, "--calibration", calibration]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^tiny\.tflite .* 40 of --calibration .* ok\s*$", text, re.M)
    assert "random" not in text


def test_the_random_inputs_hint_follows_the_rows(capsys):
    """A language model checked on text in its own tokenizer gets no hint
    about random inputs; one checked on invented prompts does."""
    from kerasnorm.cli._jobs import print_table

    def row(source):
        return ("lm.litertlm", "1.0 KiB", "9", "1e-07", source, "-", "ok")

    print_table([row("4 prompts of text in its tokenizer")], None)
    assert "random inputs" not in capsys.readouterr().out
    print_table([row("2 invented prompts")], None)
    assert "pass --verify-data" in capsys.readouterr().out.splitlines()[-1]


def test_quantize_alone_writes_only_the_quantized_file(files, capsys):
    """As the help says: the artifacts named, and only those."""
    root, model, _ = files
    out = root / "only_quantized"
    assert main(["export", model, "--out", str(out), "--quantize", "float16"]) == 0
    assert os.listdir(out) == ["tiny.float16.tflite"]
    assert "tiny.float16.tflite" in capsys.readouterr().out
    parser_help = subprocess.run(
        [sys.executable, "-m", "kerasnorm_cli", "export", "--help"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "alone, only the quantized file(s) are written" in " ".join(
        parser_help.split()
    )


def test_each_tflite_file_says_how_it_runs_on_xnnpack(files, capsys):
    """A line per .tflite file: its XNNPACK partitions; the tiny model has no
    norm, so its int8 file keeps nothing in float and says nothing of it. At
    a fixed batch (--batch-size 1) nothing is left outside: a dynamic batch
    adds shape arithmetic XNNPACK does not take."""
    root, model, calibration = files
    out = str(root / "xnnpack")
    argv = ["export", model, "--out", out, "--tflite", "--quantize", "int8"]
    argv += ["--batch-size", "1"]
    assert main([*argv, "--calibration", calibration]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in ("tiny.tflite", "tiny.int8.tflite"):
        line = next(line for line in lines if line.startswith(f"XNNPACK, {name}"))
        assert re.search(r": 1 partition, all \d+ ops delegated$", line), line


def test_the_xnnpack_line_names_the_ops_kept_in_float():
    from kerasnorm.cli._jobs import _delegation_line
    from kerasnorm.export.verify.delegation import Delegation

    split = Delegation(partitions=1, delegated_ops=9, undelegated={})
    result = types.SimpleNamespace(
        verification=types.SimpleNamespace(delegation=split),
        float_ops=("MEAN", "RSQRT"),
    )
    assert _delegation_line("m.int8.tflite", result) == (
        "XNNPACK, m.int8.tflite: 1 partition, all 9 ops delegated; int8 with "
        "MEAN, RSQRT in float (--int8-io for an integer-only file)"
    )
