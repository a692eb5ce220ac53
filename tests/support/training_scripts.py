"""Distributed training runs that the tests start in subprocesses.

Logical CPU devices must be configured, and MultiWorkerMirroredStrategy
created, before TensorFlow initializes its devices, which the test process
has long done. Usage:

    python tests/support/training_scripts.py mirrored OUT.json
    TF_CONFIG=... python tests/support/training_scripts.py worker OUT.json

`mirrored` splits the CPU into two logical devices and trains the same models
on one device and under MirroredStrategy; `worker` is one process of a
MultiWorkerMirroredStrategy cluster that trains and then also trains the
single-process reference. Both write a JSON report to OUT.json.
"""

import contextlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

GLOBAL_BATCH = 16
STEPS = 3


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH * STEPS, 6, 8)).astype("float32")
    y = rng.standard_normal((GLOBAL_BATCH * STEPS, 1)).astype("float32")
    return x, y


def build_model(synchronized_bn):
    """kerasnorm's norms and LN-LSTM, optionally a synchronized BatchNorm."""
    import keras

    import kerasnorm

    keras.utils.set_random_seed(0)
    layers = [
        keras.Input((6, 8)),
        kerasnorm.LayerNormLSTM(8, return_sequences=True),
        kerasnorm.LayerNorm(),
        kerasnorm.RMSNorm(partial=0.5),
        kerasnorm.GroupNorm(4),
        kerasnorm.InstanceNorm(),
    ]
    if synchronized_bn:
        layers.append(keras.layers.BatchNormalization(synchronized=True))
    layers += [keras.layers.Flatten(), keras.layers.Dense(1)]
    return keras.Sequential(layers)


def weights(model):
    return [w.tolist() for w in model.get_weights()]


def fit(strategy, synchronized_bn, jit_compile=True, evaluate=False):
    """Weights after `kerasnorm.training.compile` + `fit`, XLA on (the
    whole replica step, or with `jit_compile="norms"` the norm layers); with
    `evaluate`, also `evaluate` and `predict` under the strategy (each
    compiles a function of its own: only the runs a test reads do it)."""
    import keras

    import kerasnorm.training

    x, y = data()
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = build_model(synchronized_bn)
        kerasnorm.training.compile(
            model,
            optimizer=keras.optimizers.SGD(0.05),
            loss="mse",
            jit_compile=jit_compile,
        )
    initial = weights(model)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    report = {
        "initial": initial,
        "weights": weights(model),
        "jit_compile": model.jit_compile,
        "mode": kerasnorm.training.jit_compile_mode(model),
    }
    if evaluate:
        evaluated = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
        predicted = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
        report["evaluate"] = float(evaluated)
        report["mse_of_predict"] = float(((predicted - y) ** 2).mean())
    return report


def custom_loop(strategy, synchronized_bn, clip_norm=None, policy="float32"):
    """Weights and losses after `kerasnorm.training.train_step` steps."""
    import keras
    import tensorflow as tf

    import kerasnorm.training

    x, y = data()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = build_model(synchronized_bn)
            step = kerasnorm.training.train_step(
                model,
                keras.optimizers.SGD(0.05),
                keras.losses.MeanSquaredError(),
                clip_norm=clip_norm,
            )
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        if strategy:
            dataset = strategy.experimental_distribute_dataset(dataset)
        losses = [float(step(bx, by)) for bx, by in dataset]
    finally:
        keras.config.set_dtype_policy("float32")
    return {
        "weights": weights(model),
        "losses": losses,
        "optimizer": type(step.optimizer).__name__,
    }


def mirrored():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return {
        "replicas": strategy.num_replicas_in_sync,
        "fit": {
            "single": fit(None, True),
            "mirrored": fit(strategy, True, evaluate=True),
            "single_layerwise": fit(None, False),
            "mirrored_layerwise": fit(strategy, False, evaluate=True),
            "mirrored_norms": fit(strategy, False, jit_compile="norms", evaluate=True),
        },
        "step": {
            "single": custom_loop(None, False),
            "mirrored": custom_loop(strategy, False),
            # A bound small enough to clip every step: the norm clipped must
            # be the global batch's.
            "single_clipped": custom_loop(None, True, clip_norm=0.1),
            "mirrored_clipped": custom_loop(strategy, True, clip_norm=0.1),
            "mirrored_float16": custom_loop(strategy, True, policy="mixed_float16"),
        },
    }


def worker():
    """The cluster's run; the chief (worker 0) also trains the one-process
    reference, which the test compares every worker's weights with."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    report = {"replicas": strategy.num_replicas_in_sync}
    report["multi_worker"] = fit(strategy, True)
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        report["single"] = fit(None, True)
    return report


if __name__ == "__main__":
    mode, out = sys.argv[1:]
    report = {"mirrored": mirrored, "worker": worker}[mode]()
    with open(out, "w") as f:
        json.dump(report, f)
