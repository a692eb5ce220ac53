import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import pytest


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
