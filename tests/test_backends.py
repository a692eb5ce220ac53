"""kerasnorm beyond TensorFlow: the layers without TensorFlow installed, and a
model trained on JAX exported to SavedModel and TFLite.

Both run other Keras backends in subprocesses (Keras fixes its backend at
import), from the TensorFlow pass of the suite. The layers' own numeric tests
run on every backend through the passes in .ci/run.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.support.backend import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.skipif(
        BACKEND != "tensorflow",
        reason="starts its own JAX and TensorFlow processes; run once, "
        "in the TensorFlow pass",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("jax") is None,
        reason='needs JAX: pip install -e ".[test]"',
    ),
]

# Any import of TensorFlow (or of what is built on it) fails in the child,
# as it would where TensorFlow is not installed.
BLOCK_TENSORFLOW = textwrap.dedent(
    """
    import importlib.abc, sys

    BLOCKED = ("tensorflow", "tf_keras", "tensorflow_model_optimization")

    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0].startswith(BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTensorFlow())
    """
)

WITHOUT_TENSORFLOW = BLOCK_TENSORFLOW + textwrap.dedent(
    """
    import json
    import keras
    import numpy as np
    import kerasnorm

    assert keras.backend.backend() == "jax", keras.backend.backend()
    rng = np.random.default_rng(0)
    seq = rng.standard_normal((2, 5, 8)).astype("float32")
    image = rng.standard_normal((2, 4, 4, 8)).astype("float32")
    rnn = keras.layers.RNN
    cases = {
        "LayerNorm": (kerasnorm.LayerNorm(), seq),
        "RMSNorm": (kerasnorm.RMSNorm(partial=0.5), seq),
        "GroupNorm": (kerasnorm.GroupNorm(groups=2), image),
        "InstanceNorm": (kerasnorm.InstanceNorm(), image),
        "WeightNorm": (kerasnorm.WeightNorm(keras.layers.Dense(3)), seq),
        "LayerNormSimpleRNN": (kerasnorm.LayerNormSimpleRNN(3), seq),
        "LayerNormLSTM": (kerasnorm.LayerNormLSTM(3), seq),
        "LayerNormGRU": (kerasnorm.LayerNormGRU(3), seq),
        "LayerNormSimpleRNNCell": (rnn(kerasnorm.LayerNormSimpleRNNCell(3)), seq),
        "LayerNormLSTMCell": (rnn(kerasnorm.LayerNormLSTMCell(3)), seq),
        "LayerNormGRUCell": (rnn(kerasnorm.LayerNormGRUCell(3)), seq),
        "NormResidual": (kerasnorm.NormResidual(keras.layers.Dense(8), "pre"), seq),
        "TransformerEncoderBlock": (
            kerasnorm.TransformerEncoderBlock(2, 4, 16, norm_position="deepnorm",
                                              num_layers=4), seq),
        "TransformerDecoderBlock": (
            kerasnorm.TransformerDecoderBlock(2, 4, 16), [seq, seq]),
    }
    shapes = {}
    for name, (layer, x) in cases.items():
        y = layer(*x) if isinstance(x, list) else layer(x)
        y = keras.ops.convert_to_numpy(y)
        assert np.all(np.isfinite(y)), name
        shapes[name] = list(y.shape)

    # One compiled training step through a model holding several of them.
    inputs = keras.Input((5, 8))
    h = kerasnorm.LayerNormLSTM(8, return_sequences=True)(inputs)
    h = kerasnorm.RMSNorm()(kerasnorm.TransformerEncoderBlock(2, 4, 16)(h))
    outputs = keras.layers.Dense(1)(kerasnorm.LayerNormGRU(4)(h))
    model = keras.Model(inputs, outputs)
    model.compile("adam", "mse", jit_compile=True)
    history = model.fit(seq, np.ones((2, 1)), epochs=2, verbose=0)

    errors = {}
    for module in ("kerasnorm.export", "kerasnorm.training"):
        try:
            __import__(module)
        except ModuleNotFoundError as error:
            errors[module] = str(error)
    loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith("tensorflow"))
    public = sorted(
        name for name in kerasnorm.__all__
        if isinstance(getattr(kerasnorm, name), type)
        and issubclass(getattr(kerasnorm, name), keras.layers.Layer)
    )
    print(json.dumps({"shapes": shapes, "public": public, "errors": errors,
                      "loss": history.history["loss"], "loaded": loaded}))
    """
)


def _run(script, backend, *args, timeout=600):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result


# A fresh JAX process building every public class: the slow tier.
@pytest.mark.slow
def test_layers_work_without_tensorflow():
    result = _run(WITHOUT_TENSORFLOW, "jax")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    # Every public layer class was built and called.
    assert sorted(report["shapes"]) == report["public"]
    assert report["shapes"]["LayerNormLSTM"] == [2, 3]
    assert report["shapes"]["GroupNorm"] == [2, 4, 4, 8]
    assert report["shapes"]["TransformerDecoderBlock"] == [2, 5, 8]
    assert np.all(np.isfinite(report["loss"]))
    assert report["loss"][-1] != report["loss"][0]
    # Each names the extra that brings what it needs.
    for module, extra in (("kerasnorm.export", "export"), ("kerasnorm.training", "tf")):
        install = re.escape(f'pip install "kerasnorm[{extra}]"')
        assert re.search(
            rf"{re.escape(module)} needs TensorFlow.*{install}",
            report["errors"][module],
        ), report["errors"]


TRAIN_ON_JAX = textwrap.dedent(
    """
    import sys
    import keras
    import numpy as np
    import kerasnorm

    assert keras.backend.backend() == "jax"
    out = sys.argv[1]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 12, 6)).astype("float32") * 2.0 + 1.0
    y = (x.mean(axis=(1, 2)) > 1.0).astype("float32")[:, None]
    inputs = keras.Input((12, 6), name="series")
    h = keras.layers.Conv1D(8, 3, name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU()(h)
    h = kerasnorm.LayerNormLSTM(8, return_sequences=True, name="ln_lstm")(h)
    h = kerasnorm.RMSNorm(partial=0.5, name="prms")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(1, activation="sigmoid", name="score")(h)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "binary_crossentropy", jit_compile=True)
    before = model.get_layer("bn").moving_variance.numpy().copy()
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0], history.history
    assert not np.allclose(model.get_layer("bn").moving_variance.numpy(), before)
    model.save(f"{out}/trained.keras")
    np.save(f"{out}/x.npy", x[:16])
    np.save(f"{out}/y_jax.npy", keras.ops.convert_to_numpy(model(x[:16])))
    """
)

EXPORT_COMMAND = textwrap.dedent(
    """
    import sys
    import kerasnorm_cli

    sys.exit(kerasnorm_cli.main(sys.argv[1:]))
    """
)


@pytest.mark.slow
@pytest.mark.tf_only
def test_model_trained_on_jax_exports_to_tflite(tmp_path):
    """Train on JAX, save .keras; `kerasnorm export` (run with KERAS_BACKEND
    still set to jax: the command uses TensorFlow) folds the BatchNorm,
    writes and verifies a SavedModel and a TFLite file; both, and the model
    loaded here on TensorFlow, give the JAX model's outputs."""
    import keras
    import tensorflow as tf

    from kerasnorm.export import litert

    out = str(tmp_path)
    _run(TRAIN_ON_JAX, "jax", out)
    x, y_jax = np.load(f"{out}/x.npy"), np.load(f"{out}/y_jax.npy")

    loaded = keras.saving.load_model(f"{out}/trained.keras", safe_mode=True)
    np.testing.assert_allclose(np.asarray(loaded(x)), y_jax, rtol=0, atol=1e-5)

    np.save(f"{out}/verify.npy", x)
    result = _run(
        EXPORT_COMMAND,
        "jax",
        "export",
        f"{out}/trained.keras",
        "--out",
        f"{out}/deploy",
        "--verify-data",
        f"{out}/verify.npy",
    )
    assert re.search(r"folded.*bn.*conv|bn.*folded", result.stdout, re.I | re.S), (
        result.stdout
    )

    served = tf.saved_model.load(f"{out}/deploy/trained/1")
    signature = served.signatures["serving_default"]
    saved_y = next(iter(signature(series=tf.constant(x)).values())).numpy()
    np.testing.assert_allclose(saved_y, y_jax, rtol=0, atol=1e-5)

    content = open(f"{out}/deploy/trained.tflite", "rb").read()
    names = litert.op_names(content)
    assert "BATCH_NORMALIZATION" not in " ".join(names).upper()
    assert not [n for n in names if n.startswith("Flex")], names
    tflite_y = litert.Runner(content).predict(x)[0]
    np.testing.assert_allclose(tflite_y, y_jax, rtol=0, atol=1e-4)
