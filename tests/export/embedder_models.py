"""Small keras-hub `TextEmbedder`s with their own tokenizers (nothing is
downloaded), for the embedding bundle's tests and guide."""

from __future__ import annotations

import os

import keras

from tests.export import lm_models

FAMILIES = ("gemma3", "qwen3", "bert", "xlm_roberta")
# BERT's WordPiece vocabulary: the sample sentences' words.
_WORDS = (
    "the quick brown fox jumps over lazy dog . mars is often referred to as "
    "red planet , venus called earth ' s twin because of its similar size how "
    "do i reset my password ? a light ##house guides ships safely along rocky "
    "coast at night"
).split()


def text_embedder(family, directory, seed=0):
    """An untrained tiny keras-hub TextEmbedder of `family` ("gemma3": an
    EmbeddingGemma backbone, mean pooling and projection; "qwen3":
    last-token pooling; "bert", "xlm_roberta": mean pooling) with its
    preprocessor. `directory` holds the SentencePiece models."""
    import keras_hub

    models = keras_hub.models
    keras.utils.set_random_seed(seed)
    if family == "gemma3":
        with open(lm_models.chat_sentencepiece(directory), "rb") as f:
            proto = f.read()
        tokenizer = models.Gemma3Tokenizer(proto=proto, has_vision_tokens=False)
        backbone = lm_models.backbone(
            "gemma3",
            "small",
            vocabulary_size=tokenizer.vocabulary_size(),
            is_embedding_model=True,
            pooling_intermediate_dim=64,
            embedding_dim=32,
        )
        return models.Gemma3TextEmbedder(
            backbone, models.Gemma3TextEmbedderPreprocessor(tokenizer)
        )
    if family == "qwen3":
        vocabulary, merges = lm_models.byte_pair_vocabulary()
        tokenizer = models.Qwen3Tokenizer(vocabulary=vocabulary, merges=merges)
        backbone = lm_models.backbone(
            "qwen3", "small", vocabulary_size=tokenizer.vocabulary_size()
        )
        return models.Qwen3TextEmbedder(
            backbone, models.Qwen3TextEmbedderPreprocessor(tokenizer)
        )
    if family == "bert":
        vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        vocabulary += sorted(set(_WORDS))
        tokenizer = models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
        backbone = models.BertBackbone(
            vocabulary_size=len(vocabulary),
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
            max_sequence_length=64,
        )
        return models.BertTextEmbedder(
            backbone, models.BertTextEmbedderPreprocessor(tokenizer)
        )
    if family == "xlm_roberta":
        # fairseq's SentencePiece layout (<unk> 0, <s> 1, </s> 2), which
        # keras-hub's tokenizer renumbers.
        with open(lm_models.chat_sentencepiece(directory, "llama"), "rb") as f:
            proto = f.read()
        tokenizer = models.XLMRobertaTokenizer(proto=proto)
        backbone = models.XLMRobertaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(),
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
            max_sequence_length=64,
        )
        return models.XLMRobertaTextEmbedder(
            backbone, models.XLMRobertaTextEmbedderPreprocessor(tokenizer)
        )
    raise ValueError(f"family is one of {FAMILIES}. Received: {family!r}")


def directory_for(tmp_path):
    path = os.path.join(tmp_path, "tokenizer")
    os.makedirs(path, exist_ok=True)
    return path
