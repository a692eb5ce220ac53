"""Gemma 3 270M from its GGUF file as a keras-hub `Gemma3CausalLM`
(tests/support/real_models.py loads it: `real_models.load("gemma3")`). The
file holds the pretrained model, not the instruction-tuned one.

llama.cpp's Gemma converters store each RMSNorm scale as `1 + w` (Hugging
Face's Gemma multiplies by `1 + weight` with `weight` stored); keras-hub's
Gemma3 RMSNorm multiplies by `1 + scale` too, so one is subtracted from
every norm tensor (the four per block, the query/key norms, the final
norm). llama.cpp does not permute Gemma's query/key rows (its permutation is
for the llama family's RoPE layout; Gemma already uses the halves layout).
The SentencePiece tokenizer is rebuilt as a `ModelProto` from the file's
pieces, scores and types (BPE with byte fallback, Gemma's normalizer: no
dummy prefix, whitespace kept and escaped as U+2581); `<unk>` is typed
UNKNOWN and the turn tokens USER_DEFINED (the file types all three CONTROL,
which SentencePiece never reads from text).
"""

from __future__ import annotations

import numpy as np

from tests.support import real_models

# Gemma's turn format (the file has no chat template).
TURN = ("<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n")
# Typed CONTROL in the file; made USER_DEFINED so that a turn-formatted
# text tokenizes them to their ids (105, 106), as Gemma's own tokenizer does.
TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def sentencepiece_proto(metadata) -> bytes:
    """A serialized SentencePiece `ModelProto` from the GGUF tokenizer
    fields (`tokenizer.ggml.tokens`, `.scores`, `.token_type`; GGUF's token
    types number as SentencePiece's do)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    tokens = metadata["tokenizer.ggml.tokens"]
    scores = metadata["tokenizer.ggml.scores"]
    kinds = metadata["tokenizer.ggml.token_type"]
    unknown = int(metadata["tokenizer.ggml.unknown_token_id"])
    for i, (token, score, kind) in enumerate(zip(tokens, scores, kinds, strict=True)):
        piece = proto.pieces.add()
        piece.piece = token
        piece.score = float(score)
        piece.type = int(kind)
        if i == unknown:  # the file types `<unk>` CONTROL; SentencePiece
            piece.type = pb.ModelProto.SentencePiece.UNKNOWN  # needs UNKNOWN
        elif token in TURN_TOKENS:  # CONTROL pieces are never read from
            piece.type = pb.ModelProto.SentencePiece.USER_DEFINED  # text
    trainer = proto.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = True
    trainer.unk_id = int(metadata["tokenizer.ggml.unknown_token_id"])
    trainer.bos_id = int(metadata["tokenizer.ggml.bos_token_id"])
    trainer.eos_id = int(metadata["tokenizer.ggml.eos_token_id"])
    trainer.pad_id = int(metadata["tokenizer.ggml.padding_token_id"])
    trainer.unk_piece = tokens[trainer.unk_id]
    trainer.bos_piece = tokens[trainer.bos_id]
    trainer.eos_piece = tokens[trainer.eos_id]
    trainer.pad_piece = tokens[trainer.pad_id]
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = bool(
        metadata.get("tokenizer.ggml.add_space_prefix", False)
    )
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return proto.SerializeToString()


def gemma3(path, perturb, seed) -> real_models.RealModel:
    import keras_hub

    metadata, w, types = real_models.read_gguf(path, perturb=perturb, seed=seed)
    a = "gemma3."
    hidden = int(metadata[a + "embedding_length"])
    heads = int(metadata[a + "attention.head_count"])
    kv_heads = int(metadata[a + "attention.head_count_kv"])
    head_dim = int(metadata[a + "attention.key_length"])
    if float(metadata[a + "rope.freq_base"]) != 1e6:
        raise RuntimeError(
            "real_models: keras-hub's Gemma3 fixes the global RoPE base at 1e6 "
            f"(local 1e4); the file says {metadata[a + 'rope.freq_base']}"
        )
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=w["token_embd.weight"].shape[0],
        image_size=None,
        num_layers=int(metadata[a + "block_count"]),
        num_query_heads=heads,
        num_key_value_heads=kv_heads,
        hidden_dim=hidden,
        intermediate_dim=int(metadata[a + "feed_forward_length"]),
        head_dim=head_dim,
        query_head_dim_normalize=True,
        use_query_key_norm=True,
        use_post_ffw_norm=True,
        use_post_attention_norm=True,
        use_sliding_window_attention=True,
        sliding_window_size=int(metadata[a + "attention.sliding_window"]),
        layer_norm_epsilon=float(metadata[a + "attention.layer_norm_rms_epsilon"]),
    )
    backbone.get_layer("token_embedding").embeddings.assign(w.pop("token_embd.weight"))

    def norm(variable, name):
        variable.assign(w.pop(name) - 1.0)

    def heads_in(variable, matrix):  # (heads * d, in) -> (heads, in, d)
        n, _, d = variable.shape
        variable.assign(matrix.reshape(n, d, -1).transpose(0, 2, 1))

    for i in range(backbone.num_layers):
        block = backbone.get_layer(f"decoder_block_{i}")
        attention = block.attention
        p = f"blk.{i}."
        norm(block.pre_attention_norm.scale, p + "attn_norm.weight")
        norm(block.post_attention_norm.scale, p + "post_attention_norm.weight")
        norm(block.pre_ffw_norm.scale, p + "ffn_norm.weight")
        norm(block.post_ffw_norm.scale, p + "post_ffw_norm.weight")
        norm(attention.query_norm.scale, p + "attn_q_norm.weight")
        norm(attention.key_norm.scale, p + "attn_k_norm.weight")
        heads_in(attention.query_dense.kernel, w.pop(p + "attn_q.weight"))
        heads_in(attention.key_dense.kernel, w.pop(p + "attn_k.weight"))
        heads_in(attention.value_dense.kernel, w.pop(p + "attn_v.weight"))
        out = attention.output_dense.kernel  # (heads, d, hidden)
        out.assign(w.pop(p + "attn_output.weight").T.reshape(out.shape))
        block.gating_ffw.kernel.assign(w.pop(p + "ffn_gate.weight").T)
        block.gating_ffw_2.kernel.assign(w.pop(p + "ffn_up.weight").T)
        block.ffw_linear.kernel.assign(w.pop(p + "ffn_down.weight").T)
    norm(backbone.get_layer("final_normalization").scale, "output_norm.weight")
    if w:
        raise RuntimeError(f"real_models: Gemma 3 tensors left unused: {sorted(w)}")

    proto = sentencepiece_proto(metadata)
    tokenizer = keras_hub.models.Gemma3Tokenizer(proto=proto)
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(tokenizer)
    model = keras_hub.models.Gemma3CausalLM(
        backbone=backbone, preprocessor=preprocessor
    )
    bos = int(metadata["tokenizer.ggml.bos_token_id"])
    eos = int(metadata["tokenizer.ggml.eos_token_id"])
    end_of_turn = int(np.asarray(tokenizer.token_to_id("<end_of_turn>")))
    return real_models.RealModel(
        name="gemma3",
        model=model,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        turn=TURN,
        start_ids=(bos,),
        stop_ids=(eos, end_of_turn),
        perturbed=perturb,
        types=types,
        # The file is the pretrained 270M (general.name "Gemma 3 270m", no
        # chat template): asked in the turn format it repeats the question;
        # asked "Question: ...\nAnswer:" it answers " Paris".
        instruct=False,
        metadata={
            k: v for k, v in metadata.items() if not k.startswith("tokenizer.ggml.")
        },
    )
