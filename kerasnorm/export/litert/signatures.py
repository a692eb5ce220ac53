"""A file's signatures run over one packed copy of its weights.

LiteRT's Python `Interpreter` hands each signature (subgraph) to its own
XNNPACK delegate, which packs the weights it reads, so a generative file
with a decode and two prefill signatures holds three packed copies of its
weights once allocated (SmolLM2-135M's 0.50 GiB float32 file: +1.30 GiB
resident, even if only `decode` runs). LiteRT's `CompiledModel` takes an
XNNPACK weight cache: with the in-memory one (`":memory"`, no file) the
signatures share one packed copy, as LiteRT-LM's engine does (the same
file: +0.83 GiB after every signature ran, +1.53 GiB on the interpreter;
the logits equal to the interpreter's bit for bit, float32 and quantized
alike).

`signature_runners(content)` gives `{signature key: runner}` over a
`CompiledModel` with that cache where the installed ai-edge-litert has it
(`CpuOptions.xnnpack_weight_cache_path`, ai-edge-litert 2.1.6 on), else, or
where the compiled model cannot be made, over one allocated interpreter as
before. A file of one signature runs on the interpreter too: the cache has
nothing to share there and holds a copy of its own (0.6 GiB more for Gemma
3 270M's weight-only int8 decode step, `decode_report.decode_only`). A
runner is called as a `SignatureRunner` is (keyword arrays in, `{output
name: array}` out) and lists its tensors the same way
(`get_input_details()` / `get_output_details()`: `shape`, `dtype`).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import weakref

import numpy as np

from kerasnorm.export.litert.convert import stderr_captured

# XNNPACK's weight cache held in memory (an anonymous file), written nowhere.
IN_MEMORY_CACHE = ":memory"
_QUIET_EXIT = []  # whether `_discard_stderr` is registered


def signature_runners(content, delegated=True):
    """`{signature key: runner}` for flatbuffer `content`, one packed copy of
    the weights where the installed LiteRT allows (see the module).
    `delegated=False`: one interpreter on LiteRT's built-in kernels, no
    XNNPACK (`Generator` says when)."""
    from kerasnorm.export.litert.runner import interpreter
    from kerasnorm.export.litert.runner import unallocated

    shared = delegated and len(unallocated(content).get_signature_list()) > 1
    compiled = _compiled(content) if shared else None
    if compiled is not None:
        return {key: _CompiledRunner(compiled, key) for key in compiled.signature_keys}

    interp = interpreter(content, delegated)
    return {
        key: interp.get_signature_runner(key) for key in interp.get_signature_list()
    }


def shared_cache_available() -> bool:
    """Whether the installed ai-edge-litert has `CompiledModel` with an
    XNNPACK weight cache option."""
    try:
        from ai_edge_litert.compiled_model import CompiledModel  # noqa: F401
        from ai_edge_litert.options import CpuOptions
        from ai_edge_litert.options import Options  # noqa: F401
    except ImportError:
        return False
    fields = {f.name for f in dataclasses.fields(CpuOptions)}
    return "xnnpack_weight_cache_path" in fields


def _compiled(content):
    """A `_Compiled` over `content`, or None where the API is missing or the
    compiled model cannot be made (the interpreter then says why, if the
    file cannot run at all)."""
    if not shared_cache_available():
        return None
    try:
        return _Compiled(content)
    except (RuntimeError, ValueError):
        return None


class _Compiled:
    """A `CompiledModel` on the CPU (XNNPACK, one thread, as the interpreter
    runs) with an in-memory weight cache, and its signatures' tensors."""

    def __init__(self, content):
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.options import CpuOptions
        from ai_edge_litert.options import Options

        options = Options(
            cpu_options=CpuOptions(
                num_threads=1, xnnpack_weight_cache_path=IN_MEMORY_CACHE
            )
        )
        # The runtime logs its environment and XNNPACK from C++ to stderr.
        with stderr_captured(True):
            model = CompiledModel.from_buffer(content, options=options)
        # Only here, with the tensor buffers: letting the model and its
        # buffers go destroys their LiteRT environment, which logs too, so
        # `_release` lets them go inside the capture.
        self._held = {"model": model, "content": content, "buffers": {}}
        self.signature_keys = list(model.get_signature_list())
        weakref.finalize(self, _release, self._held)

    @property
    def model(self):
        return self._held["model"]

    def buffers(self, key, inputs, outputs):
        """Signature `key`'s `(inputs, outputs)` buffers by name, made at
        the first call."""
        held = self._held["buffers"]
        if key in held:
            return held[key]
        if not _QUIET_EXIT:
            _QUIET_EXIT.append(atexit.register(_discard_stderr))
        held[key] = (
            {n: self.model.create_input_buffer_by_name(key, n) for n in inputs},
            {n: self.model.create_output_buffer_by_name(key, n) for n in outputs},
        )
        return held[key]

    def called(self, key):
        """Whether signature `key` has run (its buffers are made)."""
        return key in self._held["buffers"]


class _CompiledRunner:
    """One signature of a `_Compiled`, called as a `SignatureRunner`."""

    def __init__(self, compiled, key):
        self._compiled, self._key = compiled, key
        model = compiled.model
        self._inputs = _details(model.get_input_tensor_details(key))
        self._outputs = _details(model.get_output_tensor_details(key))

    def get_input_details(self):
        return self._inputs

    def get_output_details(self):
        return self._outputs

    def __call__(self, **inputs):
        if set(inputs) != set(self._inputs):
            raise ValueError(
                f"Signature {self._key!r} takes inputs {sorted(self._inputs)}; "
                f"received {sorted(inputs)}."
            )
        # The process's first tensor buffer, at its first write, makes a
        # LiteRT environment, which logs: a signature's first writes are
        # quiet (its run is not, so that an op that fails says why).
        with stderr_captured(not self._compiled.called(self._key)):
            ins, outs = self._compiled.buffers(self._key, self._inputs, self._outputs)
            for name, value in inputs.items():
                ins[name].write(np.asarray(value, self._inputs[name]["dtype"]))
        self._compiled.model.run_by_name(self._key, ins, outs)
        return {
            name: outs[name]
            .read(int(np.prod(d["shape"])), d["dtype"])
            .reshape(d["shape"])
            for name, d in self._outputs.items()
        }


def _discard_stderr():
    """Point file descriptor 2 at the null device for the rest of the exit.

    The LiteRT environment the tensor buffers share (one a process, made at
    the first buffer) is destroyed after Python's exit handlers and logs its
    accelerators from C++ ("DestroyAccelerator") to stderr. Registered at the
    first buffer, this handler runs before those registered earlier, whose
    stderr goes too."""
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _release(held):
    with stderr_captured(True):
        held.clear()


def _details(details):
    """The compiled model's tensor details as the interpreter lists them:
    `shape` an int32 array, `dtype` a NumPy type."""
    return {
        name: {
            "name": d["name"],
            "index": d["index"],
            "shape": np.asarray(d["shape"], np.int32),
            "dtype": np.dtype(d["dtype"]).type,
        }
        for name, d in details.items()
    }
