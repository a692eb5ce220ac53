"""benchmarks/machine.py: what every benchmark prints about its machine."""

import os
import platform
import subprocess
import sys

import pytest

from benchmarks import machine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512dq avx512vl
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512dq avx512vl
"""


def test_cpu_reads_the_model_and_avx512_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert machine.cpu(str(path)) == (
        "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
        True,
    )
    # avx512vl alone (or avx512 in a longer flag) is not AVX-512 Foundation.
    path.write_text(CPUINFO.replace(" avx512f", "").replace("vl", "vl avx512fx"))
    assert machine.cpu(str(path))[1] is False


def test_cpu_without_cpuinfo_names_the_platform(tmp_path):
    model, avx512 = machine.cpu(str(tmp_path / "missing"))
    assert avx512 is None
    assert model == (platform.processor() or platform.machine() or "unknown")


def test_info_has_every_field_the_header_prints():
    info = machine.info()
    assert info["cores"] == os.cpu_count()
    assert info["python"] == platform.python_version()
    import numpy

    assert info["NumPy"] == numpy.__version__
    text = machine.header(info)
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"cpu: {info['cpu']}, {os.cpu_count()} cores, AVX-512 ")
    assert lines[1].startswith("oneDNN: TF_ENABLE_ONEDNN_OPTS")
    for name in ("TensorFlow", "Keras", "LiteRT", "NumPy"):
        assert f"{name} {info[name] or 'none'}" in lines[2]


def test_header_names_the_setting_and_what_is_in_effect():
    info = {**machine.info(), "TF_ENABLE_ONEDNN_OPTS": "0", "onednn_in_effect": False}
    assert "oneDNN: TF_ENABLE_ONEDNN_OPTS=0, in effect: no" in machine.header(info)
    info.update(TF_ENABLE_ONEDNN_OPTS=None, onednn_in_effect=None)
    assert (
        "oneDNN: TF_ENABLE_ONEDNN_OPTS unset, in effect: TensorFlow not loaded"
        in machine.header(info)
    )


@pytest.mark.tf_only
@pytest.mark.slow
@pytest.mark.parametrize("setting", ["0", "1"])
def test_onednn_in_effect_follows_the_variable(setting):
    """TensorFlow's own reading of TF_ENABLE_ONEDNN_OPTS, in a fresh process
    (TensorFlow reads it once, at import). "1" enables oneDNN on x86 Linux
    builds whatever the CPU; elsewhere only "0" is checked."""
    if setting == "1" and not (
        sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
    ):
        pytest.skip("oneDNN is built into TensorFlow's x86 Linux wheels only")
    code = "from benchmarks import machine; import tensorflow; print(machine.onednn())"
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "PYTHONPATH": ROOT}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == repr((setting, setting == "1"))


def test_onednn_is_not_read_without_tensorflow_loaded():
    code = "import sys; from benchmarks import machine; print(machine.onednn())"
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", code + "; print('tensorflow' in sys.modules)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert out.split() == ["('1',", "None)", "False"]


def test_the_header_example_in_the_docstring_holds():
    import doctest

    result = doctest.testmod(machine)
    assert result.attempted >= 1 and result.failed == 0, result
