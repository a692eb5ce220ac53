"""Quantization-aware training vs post-training int8 on scikit-learn's digits.

    python -m export.bench_qat [--epochs 15] [--qat-epochs 3] [--seeds 0 1 2]

For each seed: trains a small Keras 3 CNN (two Conv+BatchNorm+ReLU blocks,
`kerasnorm.GroupNorm`, a Dense layer with `kerasnorm.LayerNorm`) on 80% of
the digits, then measures the test accuracy (held-out 20%) of

- the float Keras model;
- its post-training int8 `.tflite` (`to_tflite(quantize="int8")`, calibrated
  on the training images), run with the LiteRT interpreter;
- its quantization-aware-trained int8 `.tflite`: `quantize_aware` (Keras 3
  rebuilt as tf_keras, TFMOT QAT), fine-tuned `--qat-epochs` epochs at a
  tenth of the learning rate, then `to_tflite(quantize="int8")`.
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from benchmarks import machine
from export import data
from export import files
from export.models import digits_cnn
from kerasnorm.export import quantize_aware
from kerasnorm.export import to_tflite


def tflite_accuracy(result, x, y):
    logits = files.first_output(files.runner(files.read(result.path)), x)
    return float(np.mean(logits.argmax(-1) == y))


def run(seed, epochs, qat_epochs, workdir):
    import tf_keras

    keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = data.digits(seed)
    model = digits_cnn()
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x_train, y_train, batch_size=32, epochs=epochs, verbose=0)
    float_acc = float(np.mean(model.predict(x_test, verbose=0).argmax(-1) == y_test))
    ptq = to_tflite(
        model,
        os.path.join(workdir, f"ptq{seed}.tflite"),
        quantize="int8",
        representative_data=x_train,
        verify_inputs=x_test,
    )
    qat_model = quantize_aware(model, verify_inputs=x_test)
    tf_keras.utils.set_random_seed(seed)
    qat_model.compile(
        tf_keras.optimizers.Adam(1e-4),
        tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    qat_model.fit(x_train, y_train, batch_size=32, epochs=qat_epochs, verbose=0)
    qat = to_tflite(
        qat_model,
        os.path.join(workdir, f"qat{seed}.tflite"),
        quantize="int8",
        representative_data=x_train,
        verify_inputs=x_test,
    )
    return (
        float_acc,
        tflite_accuracy(ptq, x_test, y_test),
        tflite_accuracy(qat, x_test, y_test),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--qat-epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    print(machine.header(load_tensorflow=True))
    print("| seed | float Keras | post-training int8 | QAT int8 |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for seed in args.seeds:
            accs = run(seed, args.epochs, args.qat_epochs, workdir)
            print(f"| {seed} | " + " | ".join(f"{a:.4f}" for a in accs) + " |")


if __name__ == "__main__":
    main()
