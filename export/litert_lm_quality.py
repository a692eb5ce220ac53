"""Each quantize mode's teacher-forced top-1 agreement with Keras and
perplexity on held-out sequences, for a decoder trained on the sequence
rule of the tests (tests/export/lm_models.py).

    PYTHONPATH=$PWD python -m export.litert_lm_quality
"""

import os
import tempfile

import keras
import numpy as np

from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from tests.export import lm_models

PROMPT = 4


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def teacher_forced(generator, sequence):
    rows = list(generator.prefill(sequence[:PROMPT]))
    for token in sequence[PROMPT:-1]:
        rows.append(generator.decode(token))
    return np.stack(rows)


def main(steps=300, held_out=16):
    keras.utils.set_random_seed(0)
    model = lm_models.train(lm_models.kerasnorm_decoder(), steps=steps)
    sequences = lm_models.rule_sequences(held_out, seed=1234)
    reference = np.asarray(model(sequences))[:, :-1]
    targets = sequences[:, 1:]

    def perplexity(logits):
        nll = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)
        return float(np.exp(nll.mean()))

    print(
        "| mode | file KB | top-1 agreement with Keras "
        "| perplexity (Keras) | perplexity (file) |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for quantize in (None, "float16", "dynamic", "weight_only_int8"):
            path = os.path.join(tmp, f"{quantize}.tflite")
            result = to_litert_lm(
                model,
                path,
                max_sequence_length=lm_models.LENGTH,
                prefill_lengths=(PROMPT,),
                # Every prompt row's logits are scored too.
                prefill_logits="all",
                quantize=quantize,
            )
            generator = litert.Generator(open(path, "rb").read())
            got = np.stack([teacher_forced(generator, s.tolist()) for s in sequences])
            agreement = float(np.mean(got.argmax(-1) == reference.argmax(-1)))
            print(
                f"| {quantize or 'float32'} | {result.size_bytes / 1e3:.0f} "
                f"| {agreement:.1%} | {perplexity(reference):.3f} "
                f"| {perplexity(got):.3f} |"
            )


if __name__ == "__main__":
    main()
