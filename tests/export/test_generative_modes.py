"""The generative quantize modes are one table (`options.generative_modes`):

- a mode registered as one row (weights int8 per channel with dynamic int8
  activations, the embedding table left float) is taken by `to_litert_lm`,
  written by the weights pass as its row says, and checked under its row's
  tolerance, with no other edit;
- no module of `litert_lm/` or `weights/` compares anything with a mode's
  name, or lists modes by name: each reads its row;
- the command line's standard-library copy of the names is the table's.
"""

import ast
import pathlib

import keras
import numpy as np
import pytest

from kerasnorm.export import to_litert_lm
from kerasnorm.export.options import generative_modes
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import INT8_DYNAMIC
from kerasnorm.export.options.generative_modes import GenerativeMode
from kerasnorm_cli import arguments
from tests.export import lm_models

# Export writes TFLite files: TensorFlow only (skipped on the JAX pass).
pytestmark = pytest.mark.tf_only

ROOT = pathlib.Path(__file__).resolve().parents[2] / "kerasnorm" / "export"
# Keras' own quantization modes ("int8", "int4") are what `keras_quantized`
# compares layers with: Keras' names, not the table's modes.
KERAS_MODES_MODULE = ROOT / "weights" / "keras_quantized.py"


def test_the_command_lines_modes_are_the_tables():
    assert arguments.GENERATIVE_QUANTIZE_MODES == generative_modes.cli_names()
    assert None in GENERATIVE_MODES and GENERATIVE_MODES[None].exact


def _mode_names_in(path):
    """(line, what) of each comparison with a mode's name, and each literal
    collection of two or more modes' names, in the module at `path`."""
    names = {m for m in GENERATIVE_MODES if m is not None}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, ast.Tuple) else [side]
                hit = [
                    v.value
                    for v in values
                    if isinstance(v, ast.Constant) and v.value in names
                ]
                if hit:
                    found.append((node.lineno, f"compares with {hit}"))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            hit = [
                e.value
                for e in elements
                if isinstance(e, ast.Constant) and e.value in names
            ]
            if len(hit) >= 2:
                found.append((node.lineno, f"lists {hit}"))
    return found


def test_no_module_names_a_mode_to_decide_its_policy():
    modules = [
        *sorted((ROOT / "litert_lm").glob("*.py")),
        *sorted((ROOT / "weights").glob("*.py")),
        ROOT / "options" / "declared.py",
    ]
    found = {
        str(path.relative_to(ROOT)): hits
        for path in modules
        if path != KERAS_MODES_MODULE and (hits := _mode_names_in(path))
    }
    assert not found, found


def test_the_scan_sees_a_planted_branch(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        'def f(mode):\n    if mode == "int4":\n        return 1\n'
        'MODES = ("dynamic", "weight_only_int8")\n'
    )
    assert sorted(line for line, _ in _mode_names_in(planted)) == [2, 4]


def test_a_new_mode_is_one_row(tmp_path, monkeypatch):
    """A row no module knows by name: int8 products with dynamic int8
    activations, the embedding table left float, its own tolerance."""
    row = GenerativeMode(
        "int8_float_table",
        "int8 weights, float embedding table",
        0.2,
        min_agreement=0.5,
        products=INT8_DYNAMIC,
    )
    monkeypatch.setitem(GENERATIVE_MODES, row.name, row)
    keras.utils.set_random_seed(0)
    decoder = lm_models.kerasnorm_decoder(layers=1, width=32)
    path = tmp_path / "new.tflite"
    result = to_litert_lm(
        decoder,
        path,
        max_sequence_length=8,
        prefill_lengths=(4,),
        quantize=row.name,
    )
    assert result.quantize == row.name
    assert result.check.rms_error <= row.tolerance
    fu = pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    model = fu.read_model_from_bytearray(bytearray(path.read_bytes()))
    graph = model.subgraphs[0]
    kinds = {}
    for op in graph.operators:
        code = fu.get_builtin_code_from_operator_code(
            model.operatorCodes[op.opcodeIndex]
        )
        kinds.setdefault(code, []).append(op)
    ops = schema.BuiltinOperator
    # Every product's constant weights int8, the op quantizing its input.
    weights = [
        graph.tensors[op.inputs[1]]
        for op in kinds[ops.FULLY_CONNECTED]
        if model.buffers[graph.tensors[op.inputs[1]].buffer].data is not None
    ]
    assert weights and all(w.type == schema.TensorType.INT8 for w in weights)
    assert all(
        op.builtinOptions.asymmetricQuantizeInputs
        for op in kinds[ops.FULLY_CONNECTED]
        if graph.tensors[op.inputs[1]] in weights
    )
    # The table stays float32: its lookup is the plain GATHER of it.
    tables = [graph.tensors[op.inputs[0]] for op in kinds[ops.GATHER]]
    table = decoder.layers[1].embeddings.numpy()
    floats = [
        t
        for t in tables
        if t.type == schema.TensorType.FLOAT32
        and model.buffers[t.buffer].data is not None
        and list(t.shape) == list(table.shape)
    ]
    assert floats
    np.testing.assert_array_equal(
        np.frombuffer(bytes(model.buffers[floats[0].buffer].data), np.float32),
        table.reshape(-1),
    )


def test_an_unknown_mode_is_refused_with_the_tables_names(tmp_path):
    keras.utils.set_random_seed(0)
    decoder = lm_models.kerasnorm_decoder(layers=1, width=16)
    with pytest.raises(
        ValueError, match=r"weight_only_int8.*Received: quantize='int3'"
    ):
        to_litert_lm(
            decoder, tmp_path / "a.tflite", max_sequence_length=8, quantize="int3"
        )
    assert not list(tmp_path.iterdir())
