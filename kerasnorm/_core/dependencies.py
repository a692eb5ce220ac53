"""Optional dependencies: a clear error where one is missing.

The layers need only Keras (any backend). `kerasnorm.training` and
`kerasnorm.legacy` build on TensorFlow itself (`tf.distribute`, tf_keras),
which is the `tf` extra; the export tools need TensorFlow (SavedModel, the
TFLite converter) and LiteRT (which runs every `.tflite` file to check it),
which is the `export` extra.
"""

import importlib.util


def install(extra):
    """The command that installs kerasnorm's `extra`."""
    return f'pip install "kerasnorm[{extra}]"'


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_tensorflow(feature, extra="tf"):
    """Raise `ModuleNotFoundError` naming `feature` if TensorFlow is missing.

    Called at the top of a subpackage that imports TensorFlow, so that the
    error says what needs it and how to install it (`extra`, the kerasnorm
    extra that brings what `feature` needs), not just "No module named
    'tensorflow'".
    """
    if not _installed("tensorflow"):
        raise ModuleNotFoundError(
            f"{feature} needs TensorFlow, which is not installed. Install it "
            f"with `{install(extra)}` (TensorFlow 2.21). The kerasnorm "
            "layers themselves run without it on the JAX and PyTorch backends.",
            name="tensorflow",
        )


def require_litert(feature):
    """Raise `ModuleNotFoundError` naming `feature` if LiteRT (the
    `ai-edge-litert` package, the `export` extra) is missing."""
    if not _installed("ai_edge_litert"):
        raise ModuleNotFoundError(
            f"{feature} needs LiteRT (the ai-edge-litert package), which is not "
            "installed: it runs every .tflite file to check it. Install it with "
            f"`{install('export')}`.",
            name="ai_edge_litert",
        )


def require_litert_lm(feature):
    """Raise `ModuleNotFoundError` naming `feature` if the LiteRT-LM bundle
    builder (`litert-lm-builder`, the `litert_lm` extra) is missing."""
    if not _installed("litert_lm_builder"):
        raise ModuleNotFoundError(
            f"{feature} needs the LiteRT-LM bundle builder (the "
            "litert-lm-builder package), which is not installed. Install it "
            f"with `{install('litert_lm')}`.",
            name="litert_lm_builder",
        )
