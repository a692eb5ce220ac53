"""Small decoder LMs trained on a sequence rule, for the generative export
tests: a rule a two-layer decoder learns in a few hundred steps, so that
greedy choices are clear.

The rule: token t+1 = (token t + token t-1) mod (VOCAB - 1) + 1 (a
Fibonacci sequence modulo a prime; 0 is never used, the padding id). A
model must look back two positions, so attention and positions matter.
"""

import keras
import numpy as np

import kerasnorm

VOCAB = 24
LENGTH = 24


def rule_sequences(count, length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    seqs = np.zeros((count, length), np.int32)
    seqs[:, :2] = rng.integers(1, VOCAB, (count, 2))
    for t in range(2, length):
        seqs[:, t] = (seqs[:, t - 1] + seqs[:, t - 2]) % (VOCAB - 1) + 1
    return seqs


def kerasnorm_decoder(
    norm_position="pre", norm_type="rms", position="rotary", width=32, layers=2
):
    """Embedding, a position embedding (rotary or keras-hub's), blocks, a
    final norm (Pre-LN) and a Dense head."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, width)(tokens)
    rope = None
    if position == "rotary":
        rope = 10000.0
    else:
        import keras_hub

        x = keras.layers.Add()([x, keras_hub.layers.PositionEmbedding(64)(x)])
    for _ in range(layers):
        x = kerasnorm.TransformerDecoderBlock(
            num_heads=2,
            key_dim=width // 2,
            intermediate_dim=2 * width,
            norm_position=norm_position,
            norm_type=norm_type,
            num_layers=layers,
            rope_max_wavelength=rope,
        )(x)
    if norm_position == "pre":
        norm = kerasnorm.RMSNorm if norm_type == "rms" else kerasnorm.LayerNorm
        x = norm()(x)
    logits = keras.layers.Dense(VOCAB, name="logits")(x)
    return keras.Model(tokens, logits)


def train(model, steps=300, seed=0):
    """`model.fit` on the rule: next-token cross-entropy."""
    keras.utils.set_random_seed(seed)
    seqs = rule_sequences(512, seed=seed)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    epochs = max(1, steps // 16)
    model.fit(seqs[:, :-1], seqs[:, 1:], batch_size=32, epochs=epochs, verbose=0)
    return model
