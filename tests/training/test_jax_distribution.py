"""kerasnorm's layers under Keras' JAX distribution API (docs/guides/training.md).

`keras.distribution.DataParallel` over two host devices splits each global
batch in two and lets XLA insert the gradient all-reduce; the weights it
trains must be those of one device on the same global batches. The child
process gets two CPU devices from `XLA_FLAGS`, which JAX reads once, at its
first use, so it cannot be set in the pytest process that already uses JAX.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.backend import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    BACKEND != "jax",
    reason="Keras' JAX distribution API: runs in the JAX pass (KERAS_BACKEND=jax)",
)

_SCRIPT = textwrap.dedent(
    """
    import json
    import jax
    import keras
    import numpy as np
    import kerasnorm

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 4))
        x = kerasnorm.LayerNormLSTM(8, return_sequences=True)(inputs)
        x = kerasnorm.GroupNorm(groups=2)(x)
        x = keras.layers.Dense(8)(x)
        x = kerasnorm.RMSNorm()(x)
        x = keras.layers.GlobalAveragePooling1D()(x)
        x = keras.layers.Dense(8)(x)
        x = kerasnorm.LayerNorm()(x)
        return keras.Model(inputs, keras.layers.Dense(3)(x))

    def train(initial):
        model = build()
        if initial is not None:
            model.set_weights(initial)
        start = [np.array(w) for w in model.get_weights()]
        model.compile(keras.optimizers.Adam(1e-2), "mse")
        history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        return model, start, history.history["loss"]

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6, 4)).astype("float32")
    y = rng.normal(size=(64, 3)).astype("float32")

    single, start, single_loss = train(None)
    devices = jax.devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    parallel, _, parallel_loss = train(start)
    # Where the weights live: replicated over both devices.
    kernel = parallel.layers[1].cell.kernel.value
    def largest_difference(first, second):
        return max(float(np.max(np.abs(np.array(a) - np.array(b))))
                   for a, b in zip(first, second))

    print(json.dumps({
        "devices": len(devices),
        "kernel_devices": len(kernel.sharding.device_set),
        "moved": largest_difference(single.get_weights(), start),
        "weight_diff": largest_difference(single.get_weights(), parallel.get_weights()),
        "loss_diff": largest_difference(single_loss, parallel_loss),
    }))
    """
)


@pytest.mark.slow
@pytest.mark.jax_pass
def test_data_parallel_matches_one_device(tmp_path):
    script = tmp_path / "data_parallel.py"
    script.write_text(_SCRIPT)
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": ROOT,
    }
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["devices"] == 2
    assert report["kernel_devices"] == 2
    # Training moved the weights, so equal weights are not the initial ones.
    assert report["moved"] > 1e-2
    # Two devices sum the batch's gradient in another order than one: float32
    # round-off, amplified over 12 Adam steps, stays well inside 5e-5.
    assert report["weight_diff"] < 5e-5, report
    assert report["loss_diff"] < 5e-5, report
