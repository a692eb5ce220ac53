"""`delegation`: XNNPACK partitions and the ops left out, read from LiteRT.

The references are independent of the data-flow reading: the file's own op
list (`litert.op_counts`, before any delegate runs) and an interpreter built
without the default delegate, where every op is on the reference kernels.
"""

import keras
import numpy as np
import pytest

from kerasnorm._compat import interpreter_ops
from kerasnorm.export import litert
from kerasnorm.export import to_tflite
from kerasnorm.export.verify.delegation import Delegation
from kerasnorm.export.verify.delegation import _split
from kerasnorm.export.verify.delegation import delegation

pytestmark = pytest.mark.tf_only

L = keras.layers


def _conv_dense():
    inputs = keras.Input((12, 12, 3))
    x = L.ReLU()(L.Conv2D(8, 3)(inputs))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(4)(x))


def _with_cumsum():
    # XNNPACK has no CUMSUM: the op splits the graph into two partitions.
    inputs = keras.Input((6,))
    x = keras.ops.cumsum(L.Dense(8)(inputs), axis=-1)
    return keras.Model(inputs, L.Dense(4)(L.ReLU()(x)))


def test_float_conv_dense_is_one_partition(tmp_path):
    content = litert.convert(_conv_dense())
    path = tmp_path / "model.tflite"
    path.write_bytes(content)
    report = delegation(str(path))
    assert report == delegation(content)
    assert report.partitions == 1
    assert report.undelegated == {}
    assert report.delegated_ops == sum(litert.op_counts(content).values())
    assert report.fully_delegated
    assert str(report) == f"1 partition, all {report.delegated_ops} ops delegated"


def test_an_op_xnnpack_does_not_take_is_reported_outside():
    content = litert.convert(_with_cumsum())
    ops = litert.op_counts(content)
    report = delegation(content)
    assert report.undelegated == {"CUMSUM": ops["CUMSUM"]}
    assert report.delegated_ops == sum(ops.values()) - ops["CUMSUM"]
    # One partition before the CUMSUM, one after it.
    assert report.partitions == 2
    assert not report.fully_delegated
    assert "CUMSUM 1" in str(report)


def test_without_a_delegate_every_op_is_undelegated():
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_litert.interpreter import OpResolverType

    content = litert.convert(_with_cumsum())
    interpreter = Interpreter(
        model_content=content,
        experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        ),
    )
    interpreter.allocate_tensors()
    report = _split(interpreter_ops(interpreter))
    assert report == Delegation(0, 0, dict(sorted(litert.op_counts(content).items())))


def test_int8_conv_dense_is_one_partition(tmp_path):
    # Without a norm, XNNPACK takes every int8 op, the QUANTIZE/DEQUANTIZE
    # pair at the border included.
    data = np.random.default_rng(0).random((8, 12, 12, 3), dtype=np.float32)
    path = tmp_path / "model.tflite"
    to_tflite(_conv_dense(), str(path), quantize="int8", representative_data=data)
    content = path.read_bytes()
    ops = litert.op_counts(content)
    assert {"QUANTIZE", "DEQUANTIZE"} <= set(ops)
    report = delegation(content)
    assert report == Delegation(1, sum(ops.values()), {})
