"""Writing and running the benchmarked files: kerasnorm's `to_tflite`,
Keras' own LiteRT export, and LiteRT's interpreter through `litert.Runner`.

Every file is run by the library's runner (float arrays in and out, the
quantized inputs and outputs converted by the tensor's scale and zero
point), XNNPACK applied as by default: the figures are the library's own
path, measured. It runs on one thread: LiteRT's Python `Interpreter` given
no `num_threads` creates its interpreter with one
(`ai_edge_litert/interpreter.py`: `int(num_threads or 1)`), a phone's big
core and the only figure a shared machine reproduces. Errors are the
library's metrics (`output_errors`), the ones `to_tflite`'s check bounds.
"""

import time

from kerasnorm.export import litert
from kerasnorm.export import output_errors
from kerasnorm.export import to_tflite


def read(path):
    """The bytes of a file."""
    with open(path, "rb") as f:
        return f.read()


def runner(content):
    """`litert.Runner` over a flatbuffer's bytes (one thread, see above).

    A file with Flex ops does not run here: LiteRT's Python package (and
    TensorFlow's deprecated `tf.lite.Interpreter`) has no Flex delegate.
    """
    return litert.Runner(content)


def streaming_runner(content):
    """`litert.StreamingRunner` over a step file's bytes."""
    return litert.StreamingRunner(content)


def first_output(run, x):
    """The first output of `run.predict(x)` (a `Runner`), one sample per call
    where the file's batch is 1."""
    return run.predict(x)[0]


def errors(want, got):
    """`{"max_rel": ..., "rms_rel": ...}` of `got` against `want` (arrays of
    one output), by `kerasnorm.export.output_errors`."""
    _, max_rel, rms_rel = output_errors([got], [want])
    return {"max_rel": max_rel, "rms_rel": rms_rel}


def error_text(err, limit=200):
    """An exception as one line of at most `limit` characters, for a cell."""
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text[:limit] + ("..." if len(text) > limit else "")


def kerasnorm_export(model, path, mode, calibration, check, batch_size=1, **kwargs):
    """`to_tflite` in quantize mode `mode` at batch `batch_size` (1: the
    fixed-shape file the tables time; None: dynamic, as `to_tflite`'s
    default and Keras' export write it), calibrated on all of `calibration`,
    checked on `check` but not gated on (the benchmark measures the error
    itself). Returns `(ExportResult, bytes, seconds)`."""
    start = time.perf_counter()
    result = to_tflite(
        model,
        path,
        quantize=mode,
        representative_data=calibration,
        calibration_samples=len(calibration),
        batch_size=batch_size,
        verify_inputs=check,
        tolerance=float("inf"),
        overwrite=True,
        **kwargs,
    )
    seconds = time.perf_counter() - start
    return result, read(path), seconds


def keras_export(model, path, mode, calibration):
    """`model.export(path, format="litert")`, the path Keras documents, with
    what its docs say to pass for int8 (`optimizations` and a
    `representative_dataset`: int8 with float fallback). Returns
    `(bytes, seconds)`."""
    import tensorflow as tf

    kwargs = {}
    if mode == "int8":
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
        kwargs["representative_dataset"] = lambda: (
            [calibration[i : i + 1]] for i in range(len(calibration))
        )
    elif mode is not None:
        raise ValueError(f"keras_export measures float32 and int8, not {mode!r}.")
    start = time.perf_counter()
    model.export(path, format="litert", verbose=False, **kwargs)
    seconds = time.perf_counter() - start
    return read(path), seconds
