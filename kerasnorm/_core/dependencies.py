"""Optional dependencies: a clear error where one is missing.

The layers need only Keras (any backend). The export tools and
`kerasnorm.training` build on TensorFlow itself (SavedModel, the TFLite
converter, `tf.distribute`), which is the `tf` extra.
"""

import importlib.util

INSTALL_TENSORFLOW = 'pip install "kerasnorm[tf]"'


def require_tensorflow(feature):
    """Raise `ModuleNotFoundError` naming `feature` if TensorFlow is missing.

    Called at the top of a subpackage that imports TensorFlow, so that the
    error says what needs it and how to install it, not just
    "No module named 'tensorflow'".
    """
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ModuleNotFoundError(
            f"{feature} needs TensorFlow, which is not installed. Install it "
            f"with `{INSTALL_TENSORFLOW}` (TensorFlow 2.21). The kerasnorm "
            "layers themselves run without it on the JAX and PyTorch backends.",
            name="tensorflow",
        )
