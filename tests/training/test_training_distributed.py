"""kerasnorm.training under MirroredStrategy and MultiWorkerMirroredStrategy.

Each distributed run trains the same model as one device does on the same
global batches and must end with the same weights: the gradients all-reduced
across replicas must equal the global batch's, synchronized BatchNorm must
see the global batch's statistics, and XLA stays on. The runs happen in
subprocesses (see training_scripts.py).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.support.once import once

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "support", "training_scripts.py")
TIMEOUT = 900

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]  # tf.distribute


def assert_same_weights(actual, expected, atol=1e-4):
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        np.testing.assert_allclose(
            np.array(a), np.array(e), atol=atol, err_msg=f"weight {index}"
        )


def _env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    # Once per test process (a set-up-again module fixture cost CI's slow
    # tier a second 100-150 s run).
    return once("mirrored", lambda: _mirrored_report(tmp_path_factory))


def _mirrored_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("mirrored") / "report.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "mirrored", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    return report


def test_fit_with_synchronized_batchnorm_matches_one_device(mirrored):
    fit = mirrored["fit"]
    assert fit["mirrored"]["jit_compile"] is True
    assert_same_weights(fit["mirrored"]["weights"], fit["single"]["weights"])


def test_fit_with_layerwise_norms_matches_one_device(mirrored):
    # No cross-replica layer: each replica's step is one XLA program.
    fit = mirrored["fit"]
    assert fit["mirrored_layerwise"]["jit_compile"] is True
    assert_same_weights(
        fit["mirrored_layerwise"]["weights"], fit["single_layerwise"]["weights"]
    )


def test_fit_with_xla_for_the_norm_layers_only_matches_one_device(mirrored):
    # jit_compile="norms": the replica step is TensorFlow's, each norm layer
    # its own XLA program.
    fit = mirrored["fit"]
    assert fit["mirrored_norms"]["mode"] == "norms"
    assert fit["mirrored_norms"]["jit_compile"] is False
    assert_same_weights(
        fit["mirrored_norms"]["weights"], fit["single_layerwise"]["weights"]
    )


@pytest.mark.parametrize("case", ["mirrored", "mirrored_layerwise", "mirrored_norms"])
def test_evaluate_under_the_strategy_is_the_mean_over_the_global_batch(mirrored, case):
    fit = mirrored["fit"][case]
    np.testing.assert_allclose(fit["evaluate"], fit["mse_of_predict"], rtol=1e-5)


def test_fit_changes_the_weights(mirrored):
    # Guards the comparisons above against a run that trained nothing.
    single = mirrored["fit"]["single"]
    moved = [
        np.max(np.abs(np.array(a) - np.array(b)))
        for a, b in zip(single["weights"], single["initial"], strict=True)
    ]
    assert max(moved) > 1e-3


@pytest.mark.parametrize("case", ["", "_clipped"])
def test_train_step_matches_one_device(mirrored, case):
    step = mirrored["step"]
    single, distributed = step[f"single{case}"], step[f"mirrored{case}"]
    assert_same_weights(distributed["weights"], single["weights"])
    # The step returns the global batch's loss, not a replica's share.
    np.testing.assert_allclose(distributed["losses"], single["losses"], rtol=1e-5)


def test_train_step_under_mixed_float16_scales_the_loss(mirrored):
    report = mirrored["step"]["mirrored_float16"]
    assert report["optimizer"] == "LossScaleOptimizer"
    assert np.all(np.isfinite(report["losses"]))
    np.testing.assert_allclose(
        report["losses"], mirrored["step"]["single_clipped"]["losses"], rtol=0.05
    )


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_multi_worker_fit_matches_one_process(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    try:
        for index in range(2):
            tf_config = {
                "cluster": {"worker": workers},
                "task": {"type": "worker", "index": index},
            }
            processes.append(
                subprocess.Popen(
                    [sys.executable, SCRIPT, "worker", str(tmp_path / f"{index}.json")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=_env(TF_CONFIG=json.dumps(tf_config)),
                )
            )
        for process in processes:
            _, stderr = process.communicate(timeout=TIMEOUT)
            assert process.returncode == 0, stderr[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    reports = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    # The chief trained the one-process reference (training_scripts.worker).
    single = reports[0]["single"]["weights"]
    for report in reports:
        assert report["replicas"] == 2
        assert report["multi_worker"]["jit_compile"] is True
        assert_same_weights(report["multi_worker"]["weights"], single)
