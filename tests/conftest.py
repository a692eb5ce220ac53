import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import pytest

_BACKEND = keras.backend.backend()

if _BACKEND == "jax":
    import jax

    # The float64 references and finite-difference tests need float64 arrays;
    # JAX computes in float32 unless told otherwise.
    jax.config.update("jax_enable_x64", True)

if _BACKEND == "torch":
    import torch

    _tensor_array = torch.Tensor.__array__

    def _detached_array(self, dtype=None, copy=None):
        # The tests read results with `np.asarray`, as on TensorFlow and JAX;
        # PyTorch refuses that for a tensor that is part of an autograd graph
        # (every layer output, since the weights require grad). Reading the
        # detached value changes no computation.
        return _tensor_array(self.detach(), dtype)

    torch.Tensor.__array__ = _detached_array


def pytest_collection_modifyitems(config, items):
    """Skip `tf_only` tests (TFLite, SavedModel, tf.distribute) on the JAX and
    PyTorch backends; everything else runs on all three."""
    if _BACKEND == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"needs TensorFlow (KERAS_BACKEND={_BACKEND})")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
