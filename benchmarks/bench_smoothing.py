"""Norm-aware smoothing (`to_tflite(..., smooth=True)`) on a trained decoder
whose norm outputs carry outlier channels.

A keras-hub Llama backbone (2 layers, hidden 32, vocabulary 64; the token
embedding reversed as its head) is trained to continue periodic token
sequences (a random pattern of period 3 to 6, repeated to 32 tokens: the
next token is the one a period back, which attention has to find). Then
three channels of every norm's gain are multiplied by 30 and the rows of
the linear layers reading that norm divided by 30: the float model is the
same function, its norm outputs now carry the outliers trained LLMs have.
Each int8 and "dynamic" file, with and without `smooth=True`, is run in
LiteRT on 256 held-out sequences: rms error of the logits against the Keras
model, and next-token accuracy on the positions past the first period.

    python -m benchmarks.bench_smoothing [--steps 600] [--gain 30] [--where gain]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

VOCABULARY, LENGTH = 64, 32
OUTLIERS = (1, 7, 20)


def sequences(n, seed):
    rng = np.random.default_rng(seed)
    periods = rng.integers(3, 7, n)
    out = np.empty((n, LENGTH + 1), "int32")
    for i, p in enumerate(periods):
        out[i] = np.resize(rng.integers(0, VOCABULARY, p), LENGTH + 1)
    return out


def lm():
    import keras

    from tests.export import lm_models

    backbone = lm_models.backbone(
        "llama", "decoder", vocabulary_size=VOCABULARY, seed=0
    )
    inputs = {
        "token_ids": keras.Input((LENGTH,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input((LENGTH,), dtype="int32", name="padding_mask"),
    }
    hidden = backbone(inputs)
    logits = backbone.token_embedding(hidden, reverse=True)
    return keras.Model(inputs, logits, name="llama_lm"), backbone


def feed(tokens):
    return {"token_ids": tokens[:, :-1], "padding_mask": np.ones_like(tokens[:, :-1])}


def accuracy(logits, tokens):
    # Positions past the longest period: the next token is determined.
    predicted = np.argmax(logits, -1)[:, 6:]
    return float(np.mean(predicted == tokens[:, 7:]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--gain", type=float, default=30.0)
    parser.add_argument(
        "--where",
        choices=("gain", "stream"),
        default="gain",
        help="outliers in every norm's gain, compensated after training "
        "(the same function), or in the residual stream: the token "
        "embedding's channels scaled before training",
    )
    args = parser.parse_args()
    import keras

    from benchmarks.machine import header
    from kerasnorm.export import to_tflite
    from kerasnorm.export.fold.smooth import _rescale
    from kerasnorm.export.fold.smooth import smoothing_sites
    from kerasnorm.export.litert.runner import interpreter

    model, backbone = lm()
    if args.where == "stream":
        table = backbone.token_embedding.embeddings
        values = table.numpy()
        values[:, list(OUTLIERS)] *= args.gain
        table.assign(values)
    train, held = sequences(4096, 1), sequences(256, 2)
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batch = 32
    epochs = max(1, args.steps * batch // len(train))
    model.fit(feed(train), train[:, 1:], batch_size=batch, epochs=epochs, verbose=0)
    reference = np.asarray(model.predict(feed(held), verbose=0))
    trained = accuracy(reference, held)
    s = np.ones(32)
    s[list(OUTLIERS)] = 1.0 / args.gain
    for norm, readers in smoothing_sites(backbone):
        if args.where == "gain":
            _rescale(norm, readers, s)
    outlier = np.asarray(model.predict(feed(held), verbose=0))
    change = np.abs(outlier - reference).max() / np.abs(reference).max()
    print(header())
    print(
        f"float: next-token accuracy {trained:.4f}; outliers x{args.gain:g} "
        f"on channels {OUTLIERS} ({args.where}): float output changed by "
        f"{change:.1e}"
    )
    print("| file | smooth | rms | next-token acc | float acc |")
    print("|---|---|---|---|---|")
    calibration = [feed(train[i : i + 8]) for i in range(0, 256, 8)]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("int8", "dynamic"):
            for smooth in (None, True):
                path = os.path.join(tmp, f"{mode}_{smooth}.tflite")
                to_tflite(
                    model,
                    path,
                    quantize=mode,
                    smooth=smooth,
                    representative_data=calibration,
                    batch_size=1,
                    verify_inputs=feed(held[:64]),
                    tolerance=10.0,
                )
                with open(path, "rb") as f:
                    runner = interpreter(f.read()).get_signature_runner()
                logits = np.concatenate(
                    [
                        next(iter(runner(**feed(held[i : i + 1])).values()))
                        for i in range(len(held))
                    ]
                )
                rms = np.sqrt(np.mean((logits - outlier) ** 2)) / np.sqrt(
                    np.mean(outlier**2)
                )
                print(
                    f"| {mode} | {'on' if smooth else 'off'} | {rms:.4f} | "
                    f"{accuracy(logits, held):.4f} | {trained:.4f} |"
                )


if __name__ == "__main__":
    main()
