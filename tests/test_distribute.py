"""kerasnorm layers under tf.distribute.MirroredStrategy on two logical CPUs.

Runs in a subprocess: logical devices must be configured before TensorFlow
initializes its devices, which the rest of the suite has already done.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np

SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras
    import numpy as np
    import kerasnorm

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((6, 8)),
            kerasnorm.LayerNormLSTM(8, return_sequences=True),
            kerasnorm.GroupNorm(4),
            kerasnorm.InstanceNorm(),
            kerasnorm.RMSNorm(partial=0.5),
            kerasnorm.LayerNorm(),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 6, 8)).astype("float32")
    y = np.linspace(-1, 1, 16, dtype="float32")[:, None]
    fit = dict(batch_size=8, epochs=3, shuffle=False, verbose=0)
    single = build().fit(x, y, **fit).history["loss"]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build()
    mirrored = model.fit(x, y, **fit).history["loss"]
    print(json.dumps({
        "replicas": strategy.num_replicas_in_sync,
        "single": single,
        "mirrored": mirrored,
    }))
    """
)


def test_mirrored_strategy_matches_single_device_training():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2
    np.testing.assert_allclose(report["mirrored"], report["single"], rtol=1e-4)
    assert report["single"][-1] < report["single"][0]
