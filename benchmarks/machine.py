"""The machine and the software stack a benchmark ran on.

Every benchmark script prints `header()` with its table (and a script that
writes JSON stores `info()` beside its rows), so that a figure in
docs/benchmarks.md or export/README.md can be traced to its CPU: a ratio
measured on an Intel Xeon is not one measured on an AMD EPYC, and
TensorFlow's oneDNN kernels run only where they are enabled.

oneDNN is reported twice: `TF_ENABLE_ONEDNN_OPTS` as set (TensorFlow reads it
once, at import) and whether oneDNN is in effect in this process. The latter
differs from the variable when it is unset: TensorFlow then enables oneDNN by
default only on some x86 CPUs. TensorFlow has no public call for it; the one
private call used here is read only if this process has imported TensorFlow
or is asked to (`load_tensorflow=True`, for a parent whose children run
TensorFlow under the same environment): importing it only to print a header
would slow a JAX or PyTorch run and means nothing there. Any failure reads
as "unknown".
"""

import importlib.metadata
import os
import platform
import sys

# (what the header calls it, distributions that provide it, first found wins)
LIBRARIES = (
    ("TensorFlow", ("tensorflow", "tensorflow-cpu", "tf-nightly")),
    ("Keras", ("keras",)),
    ("LiteRT", ("ai-edge-litert", "ai-edge-litert-nightly")),
    ("NumPy", ("numpy",)),
)


def cpu(cpuinfo="/proc/cpuinfo"):
    """(model name, whether AVX-512 is present); AVX-512 is None where the
    flags cannot be read (not Linux)."""
    model, avx512 = None, None
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and avx512 is None:
                    avx512 = "avx512f" in value.split()
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", avx512


def onednn(load_tensorflow=False):
    """(TF_ENABLE_ONEDNN_OPTS as set or None, oneDNN in effect: True, False,
    or None where unknown or TensorFlow is not loaded)."""
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if "tensorflow" not in sys.modules and not load_tensorflow:
        return setting, None
    try:
        from tensorflow.python.util import _pywrap_util_port

        return setting, bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return setting, None


def version(distributions):
    """The installed version of the first of `distributions` found, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def info(load_tensorflow=False):
    """The machine and stack, as a JSON-ready dict (`onednn` for the flag)."""
    model, avx512 = cpu()
    setting, in_effect = onednn(load_tensorflow)
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512": avx512,
        "TF_ENABLE_ONEDNN_OPTS": setting,
        "onednn_in_effect": in_effect,
        "python": platform.python_version(),
        **{name: version(dists) for name, dists in LIBRARIES},
    }


def _yes_no(value, unknown="unknown"):
    return unknown if value is None else ("yes" if value else "no")


def header(machine=None, load_tensorflow=False):
    """Three lines, what every benchmark prints with its table: the CPU
    (model, cores, AVX-512), oneDNN (the variable and whether in effect) and
    the library versions. `machine` is an `info()` dict (default: this
    process's, `info(load_tensorflow)`).

    >>> print(header({"cpu": "AMD EPYC", "cores": 2, "avx512": False,
    ...     "TF_ENABLE_ONEDNN_OPTS": None, "onednn_in_effect": True,
    ...     "python": "3.11.9", "TensorFlow": "2.21.0", "Keras": "3.15.1",
    ...     "LiteRT": None, "NumPy": "2.4.6"}))
    cpu: AMD EPYC, 2 cores, AVX-512 no
    oneDNN: TF_ENABLE_ONEDNN_OPTS unset, in effect: yes
    stack: Python 3.11.9, TensorFlow 2.21.0, Keras 3.15.1, LiteRT none, NumPy 2.4.6
    """
    machine = info(load_tensorflow) if machine is None else machine
    setting = machine["TF_ENABLE_ONEDNN_OPTS"]
    setting = " unset" if setting is None else f"={setting}"
    in_effect = _yes_no(machine["onednn_in_effect"], "TensorFlow not loaded")
    libraries = ", ".join(f"{name} {machine[name] or 'none'}" for name, _ in LIBRARIES)
    return (
        f"cpu: {machine['cpu']}, {machine['cores']} cores, "
        f"AVX-512 {_yes_no(machine['avx512'])}\n"
        f"oneDNN: TF_ENABLE_ONEDNN_OPTS{setting}, in effect: {in_effect}\n"
        f"stack: Python {machine['python']}, {libraries}"
    )
