"""Collection of the package's own modules (`--doctest-modules`)."""

import os

# Read when TensorFlow loads, which importing Keras below may do first (as in
# tests/conftest.py).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras

# `kerasnorm.legacy` refuses to import on a backend other than TensorFlow
# (its tf_keras layers compute with keras.ops); its tests skip there.
collect_ignore = []
if keras.backend.backend() != "tensorflow":
    collect_ignore.append("kerasnorm/legacy")
