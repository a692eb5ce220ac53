"""The fast int8 file keeps each attention's queries and keys in float,
from their projection to the scores' matmul (`float_nodes.query_key_nodes`).

The references: the file's own tensors (the query and key projections'
outputs float32, the feedforward projections' int8), and on a trained keras-hub
Llama whose residual stream carries outlier channels, its float next-token
accuracy (the int8 file within 1 point with the float queries and keys,
not without them)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kerasnorm.export import to_tflite
from kerasnorm.export.tflite import selective
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only

LENGTH, VOCABULARY = 32, 64


def _calibration(seed=0, n=4):
    rng = np.random.default_rng(seed)
    return [
        {
            "token_ids": rng.integers(0, VOCABULARY, (8, LENGTH)).astype("int32"),
            "padding_mask": np.ones((8, LENGTH), "int32"),
        }
        for _ in range(n)
    ]


def _projection_dtypes(path):
    """{'query'|'key'|'feedforward_gate_dense': {dtype names}} of those
    projections' outputs (rank 3: tokens x features)."""
    from ai_edge_litert.interpreter import Interpreter

    found = {"query": set(), "key": set(), "feedforward_gate_dense": set()}
    for t in Interpreter(model_path=str(path)).get_tensor_details():
        match = re.search(
            r"/(query|key|feedforward_gate_dense)(_\d+)?/MatMul", t["name"]
        )
        if match and len(t["shape"]) == 3:
            found[match.group(1)].add(np.dtype(t["dtype"]).name)
    return found


def test_queries_and_keys_stay_float_the_rest_int8(tmp_path):
    backbone = lm_models.backbone(
        "llama", "decoder", vocabulary_size=VOCABULARY, num_layers=1, seed=0
    )
    path = tmp_path / "llama.tflite"
    result = to_tflite(
        backbone,
        path,
        quantize="int8",
        representative_data=_calibration(),
        batch_size=1,
        input_signature={"token_ids": (None, LENGTH), "padding_mask": (None, LENGTH)},
    )
    dtypes = _projection_dtypes(path)
    assert dtypes["query"] == {"float32"} and dtypes["key"] == {"float32"}
    assert dtypes["feedforward_gate_dense"] == {"int8"}
    assert "FULLY_CONNECTED" in result.float_ops and "SPLIT" in result.float_ops


@pytest.mark.slow
def test_trained_outlier_decoder_int8_within_a_point(tmp_path, monkeypatch):
    import keras

    from benchmarks import bench_smoothing as bench
    from kerasnorm.export.litert.runner import interpreter

    model, backbone = bench.lm()
    table = backbone.token_embedding.embeddings
    values = table.numpy()
    values[:, list(bench.OUTLIERS)] *= 30.0
    table.assign(values)
    train, held = bench.sequences(4096, 1), bench.sequences(128, 2)
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(bench.feed(train), train[:, 1:], batch_size=32, epochs=4, verbose=0)
    reference = bench.accuracy(model.predict(bench.feed(held), verbose=0), held)
    calibration = [bench.feed(train[i : i + 8]) for i in range(0, 256, 8)]

    def int8_accuracy(name):
        path = tmp_path / f"{name}.tflite"
        to_tflite(
            model,
            path,
            quantize="int8",
            representative_data=calibration,
            batch_size=1,
            tolerance=10.0,
        )
        runner = interpreter(path.read_bytes()).get_signature_runner()
        logits = np.concatenate(
            [
                next(iter(runner(**bench.feed(held[i : i + 1])).values()))
                for i in range(len(held))
            ]
        )
        return bench.accuracy(logits, held)

    kept = int8_accuracy("kept")
    monkeypatch.setattr(selective, "query_key_nodes", lambda content: [])
    monkeypatch.setattr(selective, "query_key_split_ops", lambda content: ())
    plain = int8_accuracy("plain")
    assert reference > 0.7  # trained: the next token is one period back
    assert abs(kept - reference) <= 0.01, (kept, reference)
    assert reference - plain > 0.01, (plain, reference)
