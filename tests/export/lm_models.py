"""Small decoder LMs trained on a sequence rule, for the generative export
tests: a rule a two-layer decoder learns in a few hundred steps, so that
greedy choices are clear.

The rule: token t+1 = (token t + token t-1) mod (VOCAB - 1) + 1 (a
Fibonacci sequence modulo a prime; 0 is never used, the padding id). A
model must look back two positions, so attention and positions matter.
"""

import os

import keras
import numpy as np
import pytest

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


class _TokenIds(keras.Model):
    """A keras-hub CausalLM called on plain token arrays (its own call takes
    a dict), for `train`."""

    def __init__(self, lm):
        super().__init__(name="token_ids")
        self.lm = lm

    def call(self, tokens):
        inputs = {"token_ids": tokens, "padding_mask": tokens > -1}
        if "position_ids" in getattr(self.lm.backbone, "input", {}):
            # Gemma 4's backbone takes its rotary positions as an input.
            positions = keras.ops.arange(keras.ops.shape(tokens)[1], dtype="int32")
            inputs["position_ids"] = keras.ops.zeros_like(tokens) + positions[None]
        return self.lm(inputs)


def train(model, steps=300, seed=0):
    """`model.fit` on the rule: next-token cross-entropy; `model` (returned)
    a Keras model on token ids or a keras-hub CausalLM."""
    keras.utils.set_random_seed(seed)
    seqs = rule_sequences(512, seed=seed)
    # A keras-hub CausalLM (it has `call_with_cache`) takes a dict.
    fit = _TokenIds(model) if hasattr(model, "call_with_cache") else model
    fit.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    epochs = max(1, steps // 16)
    fit.fit(seqs[:, :-1], seqs[:, 1:], batch_size=32, epochs=epochs, verbose=0)
    return model


def teacher_forced(content, model, sequences, prompt=3):
    """Teacher-forced agreement of the generative file `content`'s argmax
    with `model`'s (a Keras model on token ids), and the file's perplexity
    on the sequences' next tokens: each sequence's first `prompt` tokens
    prefilled, the rest decoded one at a time."""
    from kerasnorm.export import litert

    generator = litert.Generator(content)
    agree, steps, nll = 0, 0, 0.0
    for seq in np.asarray(sequences).tolist():
        want = np.asarray(model(np.asarray([seq], np.int32)))[0]
        rows = [generator.prefill(seq[:prompt])[-1]]
        rows += [generator.decode(t) for t in seq[prompt:-1]]
        got = np.stack(rows)
        agree += int(np.sum(got.argmax(-1) == want[prompt - 1 : -1].argmax(-1)))
        steps += len(got)
        z = got - got.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        nll -= float(np.sum(logp[np.arange(len(got)), seq[prompt:]]))
    return agree / steps, float(np.exp(nll / steps))


# keras-hub CausalLMs with their own tokenizers, made here (no downloads):
# a chat task for a Gemma-family model with a SentencePiece tokenizer that
# holds the turn tokens, and a byte-pair tokenizer for Qwen3.

CHAT_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


def gemma_turns(user, reply=None):
    """Gemma's turn format: a user turn, then the model's (open when
    `reply` is None: the prompt a chat engine feeds)."""
    prompt = f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"
    return prompt if reply is None else f"{prompt}{reply}<end_of_turn>\n"


def gemma4_turns(user, reply=None):
    """Gemma 4's turn format (`<|turn>` ... `<turn|>`), as `gemma_turns`."""
    prompt = f"<|turn>user\n{user}<turn|>\n<|turn>model\n"
    return prompt if reply is None else f"{prompt}{reply}<turn|>\n"


# Gemma 4's chat tokens: turns, tool declarations, calls and responses,
# string quotes, thinking.
GEMMA4_TOKENS = (
    "<|turn>",
    "<turn|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|channel>",
    "<channel|>",
    "<|think|>",
)


def chat_pairs(count, seed=0):
    """(user, reply) pairs of the toy chat task: the user says a word, the
    model answers with the next two words of a fixed cycle."""
    rng = np.random.default_rng(seed)
    n = len(CHAT_WORDS)
    return [
        (CHAT_WORDS[s], f"{CHAT_WORDS[(s + 1) % n]} {CHAT_WORDS[(s + 2) % n]}")
        for s in rng.integers(0, n, count)
    ]


def chat_sentencepiece(directory, layout="gemma"):
    """A SentencePiece model in Gemma's layout (<pad> 0, <eos> 1, <bos> 2,
    <unk> 3; `layout="llama"`: <unk> 0, <s> 1, </s> 2, no pad) holding
    `<start_of_turn>`, `<end_of_turn>` (`layout="gemma4"`: Gemma 4's chat
    tokens) and a newline piece, trained on the chat task's text; the path
    of its `.model` file."""
    import sentencepiece as spm

    prefix = os.path.join(directory, f"chat_{layout}")
    turns, symbols = gemma_turns, ["<start_of_turn>", "<end_of_turn>"]
    if layout == "gemma4":
        turns, symbols = gemma4_turns, list(GEMMA4_TOKENS)
    if layout == "llama":
        ids = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
        pieces = dict(unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>")
    else:
        ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3)
        pieces = dict(
            pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>"
        )
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(turns(u, r) for u, r in chat_pairs(200, 1)),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=48,
        **ids,
        **pieces,
        user_defined_symbols=[*symbols, "\n"],
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return prefix + ".model"


def padded_sentencepiece(directory, size):
    """A SentencePiece model in Gemma's layout (`chat_sentencepiece`)
    padded with pieces of its own up to `size`, the model's vocabulary: the
    engine detokenizes every id a random model picks (a smaller tokenizer
    ends its decode at the first id past it). Its path."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(chat_sentencepiece(directory), "rb") as f:
        proto.ParseFromString(f.read())
    for i in range(len(proto.pieces), size):
        piece = proto.pieces.add()
        piece.piece, piece.score = f"<pad{i}>", -1e9
        piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    path = os.path.join(directory, "padded.model")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path


def one_mode_each(families, modes, group, covered=()):
    """A family-by-mode matrix's `pytest.param`s, `(family, *mode)`: each
    family's cells on one test process (`xdist_group` "{group}-{family}",
    which trains its model once). CI's slow tier runs each family not in
    `covered` in one mode, the modes rotating down the list (the i-th such
    family in mode i mod len(modes), so each mode meets several families);
    every other cell is `exhaustive`."""
    rotating = [f for f in families if f not in covered]
    for family in families:
        for m, mode in enumerate(modes):
            ci = family in rotating and rotating.index(family) % len(modes) == m
            yield pytest.param(
                family,
                *mode,
                marks=(pytest.mark.xdist_group(f"{group}-{family}"),)
                + (() if ci else (pytest.mark.exhaustive,)),
            )


def fit_preprocessed(trainer, x, y, weights, epochs, learning_rate=1e-2):
    """Train `trainer` (a keras-hub CausalLM without a preprocessor, or a
    model of token ids) for `epochs` on a preprocessor's output made up
    front: keras-hub's SentencePiece op inside fit's tf.data map loses its
    resource."""
    trainer.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    if isinstance(x, dict):
        x = {k: np.asarray(v) for k, v in x.items()}
    trainer.fit(
        x,
        np.asarray(y),
        sample_weight=np.asarray(weights),
        batch_size=32,
        epochs=epochs,
        verbose=0,
    )


def gemma_chat_lm(directory, epochs=12, seed=0):
    """A tiny keras-hub GemmaCausalLM trained for seconds on the chat task
    (greedy sampler), with its SentencePiece tokenizer."""
    import keras_hub

    with open(chat_sentencepiece(directory), "rb") as f:
        tokenizer = keras_hub.models.GemmaTokenizer(proto=f.read())
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=16,
    )
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(
        tokenizer, sequence_length=24
    )
    causal_lm = keras_hub.models.GemmaCausalLM(backbone, preprocessor)
    # Token ids made up front: keras-hub's SentencePiece op inside fit's
    # tf.data map loses its resource.
    x, y, weights = preprocessor([gemma_turns(u, r) for u, r in chat_pairs(256)])
    trainer = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    fit_preprocessed(trainer, x, y, weights, epochs)
    causal_lm.compile(sampler="greedy")
    return causal_lm


def gemma4_chat_lm(
    directory, epochs=12, seed=0, config="per_layer", learning_rate=1e-2, **overrides
):
    """A tiny keras-hub Gemma4CausalLM (`GEMMA4[config]`, `overrides`
    replacing its arguments) trained for seconds on the chat task in Gemma
    4's turn format (greedy sampler), with its SentencePiece tokenizer."""
    import keras_hub

    with open(chat_sentencepiece(directory, "gemma4"), "rb") as f:
        tokenizer = keras_hub.models.Gemma4Tokenizer(
            proto=f.read(),
            has_vision_tokens=False,
            has_audio_tokens=False,
            has_video_tokens=False,
        )
    preprocessor = keras_hub.models.Gemma4CausalLMPreprocessor(
        tokenizer, sequence_length=24
    )
    model = gemma4_causal_lm(
        config, seed=seed, vocabulary_size=tokenizer.vocabulary_size(), **overrides
    )
    pairs = chat_pairs(256)
    x, y, weights = preprocessor(
        {
            "prompts": [gemma4_turns(u) for u, _ in pairs],
            "responses": [f"{r}<turn|>\n" for _, r in pairs],
        }
    )
    fit_preprocessed(
        _TokenIds(model), x["token_ids"], y, weights, epochs, learning_rate
    )
    causal_lm = keras_hub.models.Gemma4CausalLM(
        backbone=model.backbone, preprocessor=preprocessor
    )
    causal_lm.compile(sampler="greedy")
    return causal_lm


def byte_pair_vocabulary(specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    """A byte-level BPE vocabulary and merges trained here with the
    `tokenizers` library (keras-hub's dependency) on the chat words, the
    `specials` appended: (vocabulary dict, merges list)."""
    from tokenizers import Tokenizer
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = [" ".join(CHAT_WORDS[i:] + CHAT_WORDS[:i]) for i in range(8)]
    bpe.train_from_iterator(text * 4, trainer)
    spec = __import__("json").loads(bpe.to_str())
    vocabulary = dict(spec["model"]["vocab"])
    for token in specials:
        vocabulary[token] = len(vocabulary)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return vocabulary, merges


def keras_hub_lm(family, directory=None, seed=0):
    """An untrained tiny keras-hub CausalLM of `family` ("llama", "gemma",
    "gemma3", "qwen3") with its own tokenizer (SentencePiece trained in `directory`
    for llama and gemma; byte-pair for qwen3) and a preprocessor."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    models = keras_hub.models
    if family not in ("llama", "gemma", "gemma3", "qwen3"):
        raise ValueError(
            f"family is one of llama, gemma, gemma3, qwen3. Received: {family!r}"
        )
    if family == "qwen3":
        vocabulary, merges = byte_pair_vocabulary()
        tokenizer = models.Qwen3Tokenizer(vocabulary=vocabulary, merges=merges)
    else:
        layout = "llama" if family == "llama" else "gemma"
        with open(chat_sentencepiece(directory, layout), "rb") as f:
            proto = f.read()
        tokenizer = {
            "llama": lambda: models.LlamaTokenizer(proto=proto),
            "gemma": lambda: models.GemmaTokenizer(proto=proto),
            "gemma3": lambda: models.Gemma3Tokenizer(
                proto=proto, has_vision_tokens=False
            ),
        }[family]()
    preprocessor = getattr(models, CAUSAL_LMS[family] + "Preprocessor")(
        tokenizer, sequence_length=16
    )
    return causal_lm(
        family,
        "small" if family == "gemma3" else "tokenizer",
        preprocessor=preprocessor,
        vocabulary_size=tokenizer.vocabulary_size(),
    )


# keras-hub's decoder language models, from small configurations with random
# weights (nothing is downloaded). One builder for tests, benchmarks and the
# export/ scripts; keras-hub is imported when a model is built (the
# oldest-stack pass installs none).

SIZES = {
    # The matrix's models: trained on the rule above in seconds.
    "small": {
        "vocabulary_size": VOCAB,
        "num_layers": 2,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 32,
        "intermediate_dim": 64,
    },
    # keras-hub's decoders through to_tflite, smoothing and the query/key
    # int8 islands: grouped keys/values (2 query heads, 1 key/value head).
    "decoder": {
        "vocabulary_size": 256,
        "num_layers": 2,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 32,
        "intermediate_dim": 64,
    },
    # The models with a tokenizer of their own (`keras_hub_lm`); the
    # vocabulary is the tokenizer's.
    "tokenizer": {
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 32,
        "intermediate_dim": 64,
    },
    # A smoke test of the generation benchmark.
    "quick": {
        "vocabulary_size": 512,
        "num_layers": 2,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 64,
        "intermediate_dim": 128,
    },
    # The Llama-style configuration of litert-torch's figures.
    "medium": {
        "vocabulary_size": 32000,
        "num_layers": 4,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 256,
        "intermediate_dim": 688,
    },
}
# Large decoder shapes, random weights: export memory and time at real
# sizes (`export/bench_export_memory.py`; `causal_lm(family, **shape)`).
# An entry's `family` is the CausalLM's, Llama unless given.
LM_SHAPES = {
    "gemma3-270m": dict(
        family="gemma3",
        vocabulary_size=262144,
        num_layers=18,
        hidden_dim=640,
        num_query_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_dim=2048,
        query_head_dim_normalize=True,
        use_query_key_norm=True,
        use_post_ffw_norm=True,
        use_post_attention_norm=True,
        use_sliding_window_attention=True,
        sliding_window_size=512,
    ),
    "medium": dict(
        vocabulary_size=32000,
        num_layers=4,
        hidden_dim=256,
        num_query_heads=4,
        num_key_value_heads=2,
        intermediate_dim=768,
    ),
    "llama-1b": dict(
        vocabulary_size=128256,
        num_layers=16,
        hidden_dim=2048,
        num_query_heads=32,
        num_key_value_heads=8,
        intermediate_dim=8192,
        tie_word_embeddings=True,
        rope_max_wavelength=500000,
    ),
    # tests/export/test_litert_lm_memory.py's model: 42 MB of float32 weights.
    "small": dict(
        vocabulary_size=4096,
        num_layers=2,
        hidden_dim=512,
        num_query_heads=8,
        num_key_value_heads=4,
        intermediate_dim=1536,
    ),
    # A Llama-3.2-1B layer under a 32000-word vocabulary, tied.
    "wide": dict(
        vocabulary_size=32000,
        num_layers=1,
        hidden_dim=2048,
        num_query_heads=32,
        num_key_value_heads=8,
        intermediate_dim=8192,
        tie_word_embeddings=True,
    ),
}
BACKBONES = {
    "gemma": "GemmaBackbone",
    "gemma3": "Gemma3Backbone",
    "gpt2": "GPT2Backbone",
    "llama": "LlamaBackbone",
    "mistral": "MistralBackbone",
    "phi3": "Phi3Backbone",
    "qwen3": "Qwen3Backbone",
}
CAUSAL_LMS = {
    family: name.replace("Backbone", "CausalLM") for family, name in BACKBONES.items()
}
# Gemma3 with all its norms and a sliding window short enough to act on
# the tests' lengths.
GEMMA3_SLIDING = {
    "image_size": 896,
    "use_query_key_norm": True,
    "use_post_ffw_norm": True,
    "use_post_attention_norm": True,
    "use_sliding_window_attention": True,
    "sliding_window_size": 16,
}
# The families whose constructor takes the head size; the others' is
# hidden_dim / num_query_heads (Mistral's too unless it is given).
_HEAD_DIM = ("gemma", "gemma3", "qwen3")


def backbone(family, size="small", *, seed=None, **config):
    """A keras-hub decoder backbone of `family` in a named size.

    Args:
        family: a key of `BACKBONES` ("gemma", "gemma3", "gpt2", "llama",
            "mistral", "phi3", "qwen3").
        size: a key of `SIZES`; `config` overrides its entries.
        seed: when given, `keras.utils.set_random_seed(seed)` first.
        **config: `vocabulary_size`, `num_layers`, `num_query_heads`,
            `num_key_value_heads`, `hidden_dim`, `intermediate_dim`,
            `head_dim` (Gemma, Gemma3 and Qwen3 default to hidden_dim /
            num_query_heads; the others accept only that value, or Mistral
            any), and the family's own options (`sliding_window`,
            `image_size`, `max_sequence_length`, ...). GPT-2 takes
            `num_query_heads` as its `num_heads`; it has no grouped
            keys/values, so `num_key_value_heads` is not used for it;
            its `max_sequence_length` defaults to 64; Gemma3's
            `image_size` to None (text only).
    """
    import keras_hub

    if family not in BACKBONES:
        raise ValueError(
            f"family must be one of {sorted(BACKBONES)}. Received: family={family!r}"
        )
    if size not in SIZES:
        raise ValueError(
            f"size must be one of {sorted(SIZES)}. Received: size={size!r}"
        )
    config = {**SIZES[size], **config}
    heads = config["num_query_heads"]
    head_dim = config.pop("head_dim", None)
    default_head_dim = config["hidden_dim"] // heads
    if family in _HEAD_DIM:
        config["head_dim"] = head_dim or default_head_dim
    elif family == "mistral" and head_dim not in (None, default_head_dim):
        config["head_dim"] = head_dim
    elif head_dim not in (None, default_head_dim):
        raise ValueError(
            f"{family}'s head size is hidden_dim / num_query_heads = "
            f"{default_head_dim}. Received: head_dim={head_dim}"
        )
    if family == "gpt2":
        config["num_heads"] = config.pop("num_query_heads")
        config.pop("num_key_value_heads")
        config.setdefault("max_sequence_length", 64)
    if family == "gemma3":
        config.setdefault("image_size", None)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    return getattr(keras_hub.models, BACKBONES[family])(**config)


def causal_lm(family, size="small", *, preprocessor=None, seed=None, **config):
    """keras-hub's CausalLM of `family` around `backbone(family, size,
    seed=seed, **config)`, with `preprocessor` (None: token ids in, logits
    out)."""
    import keras_hub

    model = backbone(family, size, seed=seed, **config)
    return getattr(keras_hub.models, CAUSAL_LMS[family])(
        backbone=model, preprocessor=preprocessor
    )


# Every text CausalLM family of keras-hub, in a small configuration with
# random weights (nothing is downloaded): the generic cached step's matrix.
# Each entry: the CausalLM class, the backbone class, and the backbone's
# arguments beyond `vocabulary_size`.
_SMALL = {"num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
_GQA = {**_SMALL, "num_query_heads": 4, "num_key_value_heads": 2}
_SMOLLM3 = {
    **_SMALL,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_layer_enabled_list": [True, False],
    "layer_types": ["attention", "attention"],
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-6,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 1.0,
}
HUB_FAMILIES = {
    "gemma": ("GemmaCausalLM", "GemmaBackbone", {**_GQA, "head_dim": 8}),
    # Global attention only, query/key norms and both soft caps.
    "gemma3": (
        "Gemma3CausalLM",
        "Gemma3Backbone",
        {
            **_GQA,
            "head_dim": 8,
            "image_size": None,
            "use_sliding_window_attention": False,
            "use_query_key_norm": True,
            "attention_logit_soft_cap": 50.0,
            "final_logit_soft_cap": 30.0,
        },
    ),
    # Five sliding-window layers then a global one (keras-hub interleaves
    # them 5:1), the window shorter than the tests' context.
    "gemma3_window": (
        "Gemma3CausalLM",
        "Gemma3Backbone",
        {
            "num_layers": 6,
            "hidden_dim": 16,
            "intermediate_dim": 32,
            "num_query_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "image_size": None,
            "use_sliding_window_attention": True,
            "sliding_window_size": 6,
        },
    ),
    "llama": ("LlamaCausalLM", "LlamaBackbone", _GQA),
    "llama3": ("Llama3CausalLM", "Llama3Backbone", _GQA),
    # A sliding window shorter than the tests' context.
    "mistral": ("MistralCausalLM", "MistralBackbone", {**_GQA, "sliding_window": 8}),
    "mixtral": (
        "MixtralCausalLM",
        "MixtralBackbone",
        {**_GQA, "num_experts": 4, "top_k": 2, "sliding_window": 64},
    ),
    "qwen": ("QwenCausalLM", "QwenBackbone", _GQA),
    "qwen2": ("Qwen2CausalLM", "QwenBackbone", _GQA),
    "qwen3": ("Qwen3CausalLM", "Qwen3Backbone", {**_GQA, "head_dim": 8}),
    "qwen3_moe": (
        "Qwen3MoeCausalLM",
        "Qwen3MoeBackbone",
        {
            **_GQA,
            "head_dim": 8,
            "moe_intermediate_dim": 32,
            "num_experts": 4,
            "top_k": 2,
        },
    ),
    "qwen_moe": (
        "QwenMoeCausalLM",
        "QwenMoeBackbone",
        {
            **_GQA,
            "moe_intermediate_dim": 32,
            "shared_expert_intermediate_dim": 32,
            "num_experts": 4,
            "top_k": 2,
        },
    ),
    # Long-context rotary scaling ("su"). keras-hub picks the long factors
    # once the last position passes the pretraining length, for the whole
    # call: its cached steps before that point keep the short ones, which a
    # full pass past it does not. A pretraining length shorter than any
    # prompt keeps generation in the long regime throughout.
    "phi3": (
        "Phi3CausalLM",
        "Phi3Backbone",
        {
            **_GQA,
            "max_sequence_length": 64,
            "pretraining_sequence_length": 4,
            "rope_scaling_type": "su",
            "rope_scaling_short_factor": [1.0, 1.1, 1.2, 1.3],
            "rope_scaling_long_factor": [1.5, 2.0, 2.5, 3.0],
        },
    ),
    # The second layer has no rotary embedding (SmolLM3's NoPE layers).
    "smollm3": ("SmolLM3CausalLM", "SmolLM3Backbone", _SMOLLM3),
    # keras-hub's SmolLM class: SmolLM3's model under another name.
    "smollm": ("SmolLMCausalLM", "SmolLM3Backbone", _SMOLLM3),
    "gpt2": (
        "GPT2CausalLM",
        "GPT2Backbone",
        {**_SMALL, "num_heads": 2, "max_sequence_length": 64},
    ),
    "gpt_neox": (
        "GPTNeoXCausalLM",
        "GPTNeoXBackbone",
        {**_SMALL, "num_heads": 2, "max_sequence_length": 64},
    ),
    "falcon": (
        "FalconCausalLM",
        "FalconBackbone",
        {**_SMALL, "num_attention_heads": 2},
    ),
    "opt": (
        "OPTCausalLM",
        "OPTBackbone",
        {**_SMALL, "num_heads": 2, "max_sequence_length": 64},
    ),
    # ALiBi: positions as a bias on the scores, no position embedding.
    "bloom": ("BloomCausalLM", "BloomBackbone", {**_SMALL, "num_heads": 4}),
    # Sliding window on every other layer, mixture of experts, sinks.
    "gpt_oss": (
        "GptOssCausalLM",
        "GptOssBackbone",
        {**_GQA, "head_dim": 8, "num_experts": 4, "top_k": 2, "sliding_window": 8},
    ),
}


def hub_causal_lm(family, *, seed=None, vocabulary_size=VOCAB, **config):
    """keras-hub's CausalLM of `family` (a key of `HUB_FAMILIES`) in its
    small configuration, `config` overriding the backbone's arguments; no
    preprocessor (token ids in, logits out)."""
    import keras_hub

    if family not in HUB_FAMILIES:
        raise ValueError(
            f"family must be one of {sorted(HUB_FAMILIES)}. Received: family={family!r}"
        )
    lm_name, backbone_name, arguments = HUB_FAMILIES[family]
    if seed is not None:
        keras.utils.set_random_seed(seed)
    backbone = getattr(keras_hub.models, backbone_name)(
        vocabulary_size=vocabulary_size, **{**arguments, **config}
    )
    return getattr(keras_hub.models, lm_name)(backbone=backbone, preprocessor=None)


# Gemma 4's text decoders, small (issue 60): four layers alternating
# sliding-window (window 4, shorter than the tests' context) and global,
# the global layers' head size (16) twice the local one (8).
_GEMMA4 = {
    "image_size": None,
    "num_layers": 4,
    "num_query_heads": 4,
    "num_key_value_heads": 2,
    "hidden_dim": 32,
    "intermediate_dim": 64,
    "head_dim": 8,
    "global_head_dim": 16,
    "sliding_window_size": 4,
    "sliding_window_pattern": 2,
    "final_logit_soft_cap": 30.0,
}
GEMMA4 = {
    # The 2B/4B "E" models' layout: per-layer inputs (32 wide: int4's
    # smallest block divides it) and the last layer reading layer 1's keys
    # and values (the last global layer that writes a cache).
    "per_layer": {
        **_GEMMA4,
        "hidden_size_per_layer_input": 32,
        "num_kv_shared_layers": 1,
    },
    # The 31B's: no per-layer inputs, the global layers' keys equal to their
    # values with one key/value head.
    "dense": {**_GEMMA4, "num_global_key_value_heads": 1},
    # The 26B-A4B's: a mixture-of-experts block beside each feed-forward.
    "moe": {
        **_GEMMA4,
        "enable_moe_block": True,
        "num_experts": 4,
        "expert_intermediate_dim": 32,
        "num_experts_per_token": 2,
    },
}


def gemma4_causal_lm(
    config, *, seed=None, vocabulary_size=VOCAB, preprocessor=None, **overrides
):
    """keras-hub's `Gemma4CausalLM` in the small configuration `config` (a
    key of `GEMMA4`, `overrides` replacing its arguments), text only."""
    import keras_hub

    if seed is not None:
        keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Gemma4Backbone(
        vocabulary_size=vocabulary_size, **{**GEMMA4[config], **overrides}
    )
    return keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=preprocessor)


# --- decoders as users write them (issue 49) --------------------------------


def hub_gpt(width=32, layers=2, heads=2, length=64):
    """keras.io's "GPT text generation from scratch with KerasHub" layout:
    keras-hub `TokenAndPositionEmbedding` (mask_zero), `TransformerDecoder`
    blocks called on one sequence, a `Dense` head."""
    import keras_hub

    tokens = keras.Input((None,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size=VOCAB,
        sequence_length=length,
        embedding_dim=width,
        mask_zero=True,
    )(tokens)
    for _ in range(layers):
        x = keras_hub.layers.TransformerDecoder(
            num_heads=heads, intermediate_dim=2 * width
        )(x)
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


def operator_decoder(width=32, layers=2, length=64):
    """`x = x + PositionEmbedding(L)(x)` (Keras' operator), kerasnorm blocks,
    keras.ops calls per position on the way (a scale, a cast, gelu)."""
    import keras_hub

    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, width)(tokens)
    x = x * (width**0.5)
    x = x + keras_hub.layers.PositionEmbedding(length)(x)
    for _ in range(layers):
        x = kerasnorm.TransformerDecoderBlock(
            num_heads=2, key_dim=width // 2, intermediate_dim=2 * width
        )(x)
    x = keras.ops.cast(kerasnorm.LayerNorm()(x), "float32")
    x = keras.ops.multiply(keras.activations.gelu(x), 0.5) + x
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


def attention_decoder(width=32, layers=2, heads=2, length=64):
    """Keras' `MultiHeadAttention(use_causal_mask=True)` in a functional
    graph, LayerNormalization and a Dense feed-forward around it, residual
    adds by operator."""
    import keras_hub

    tokens = keras.Input((None,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(VOCAB, length, width)(tokens)
    for _ in range(layers):
        h = keras.layers.LayerNormalization()(x)
        x = x + keras.layers.MultiHeadAttention(heads, width // heads)(
            h, h, use_causal_mask=True
        )
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(2 * width, activation="relu")(h)
        x = x + keras.layers.Dense(width)(h)
    x = keras.layers.LayerNormalization()(x)
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


class MiniTokenAndPositionEmbedding(keras.layers.Layer):
    """keras.io "miniature GPT"'s embedding, as the tutorial writes it."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(vocab_size, embed_dim)
        self.pos_emb = keras.layers.Embedding(maxlen, embed_dim)

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = self.pos_emb(keras.ops.arange(0, maxlen, 1))
        return self.token_emb(x) + positions


class MiniTransformerBlock(keras.layers.Layer):
    """keras.io "miniature GPT"'s block, as the tutorial writes it."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads, embed_dim)
        self.ffn = keras.Sequential(
            [
                keras.layers.Dense(ff_dim, activation="relu"),
                keras.layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs):
        attention_output = self.att(inputs, inputs, use_causal_mask=True)
        attention_output = self.dropout1(attention_output)
        out1 = self.layernorm1(inputs + attention_output)
        ffn_output = self.dropout2(self.ffn(out1))
        return self.layernorm2(out1 + ffn_output)


# The documented change (docs/guides/generation.md, "Your own decoder"): one
# `cached_step` per layer that mixes positions.
class CachedMiniTokenAndPositionEmbedding(MiniTokenAndPositionEmbedding):
    def cached_step(self, x, positions):
        return self.token_emb(x) + self.pos_emb(positions)[None]


class CachedMiniTransformerBlock(MiniTransformerBlock):
    def cached_step(self, x, key_cache, value_cache, positions):
        from kerasnorm.export import cached_multi_head_attention

        attention_output, caches = cached_multi_head_attention(
            self.att, x, key_cache, value_cache, positions
        )
        out1 = self.layernorm1(x + attention_output)
        return self.layernorm2(out1 + self.ffn(out1)), caches


def miniature_gpt(cached=False, width=32, heads=2, layers=1, length=64):
    """keras.io's "miniature GPT" (logits as the one output), with the
    documented `cached_step` methods when `cached`."""
    embedding = (
        CachedMiniTokenAndPositionEmbedding
        if cached
        else (MiniTokenAndPositionEmbedding)
    )
    block = CachedMiniTransformerBlock if cached else MiniTransformerBlock
    tokens = keras.Input((None,), dtype="int32")
    x = embedding(length, VOCAB, width)(tokens)
    for _ in range(layers):
        x = block(width, heads, 2 * width)(x)
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


def train_causal_lm(model, steps=100, seed=0):
    """`fit` of a keras-hub CausalLM on the rule (token ids and a padding
    mask in, next tokens out)."""
    keras.utils.set_random_seed(seed)
    seqs = rule_sequences(256, seed=seed)
    x = {"token_ids": seqs[:, :-1], "padding_mask": np.ones_like(seqs[:, :-1], bool)}
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    epochs = max(1, steps // 8)
    model.fit(x, seqs[:, 1:], batch_size=32, epochs=epochs, verbose=0)
    return model
