"""The graphs of an embedding bundle (`to_litert_embedder`) and the checks
of the embedder they are traced from: the TEXT_ENCODER's `encoder_<T>`
signatures over the whole Keras embedder, the EMBEDDER's identity on the
token id, and both run as LiteRT-LM's embedding engine feeds them."""

from __future__ import annotations

import dataclasses
import tempfile

import numpy as np

from kerasnorm.export.numerics.errors import ExportConversionError
from kerasnorm.export.options.generative_modes import GENERATIVE_MODES
from kerasnorm.export.options.generative_modes import INT4_BLOCKS
from kerasnorm.export.options.generative_modes import INT8_ROWS

# Token ids travel as float32 between the two models: exact below 2**24.
_EXACT_IDS = 2**24
_INPUTS = ("token_ids", "padding_mask", "segment_ids")
# An embedder's "int4" looks its token table up in int8 rows, not int4
# blocks (`quantized_encoder`): an embedding is a pooled sum of the table's
# rows, which no later product rounds away. The tests' tiny untrained
# embedders (seeds 0-2, lengths 8-32), least cosine with GPTQ: Gemma3
# 0.978-0.989 with the table int4, 0.983-0.996 int8; Qwen3 0.979-0.989,
# 0.984-0.996 (docs/guides/chat.md).
TABLE_LOOKUP = INT8_ROWS
# And each attention's value and output products at int8 per output
# channel (dynamic range, as `"dynamic"` writes them), as llama.cpp's
# Q4_K_M keeps value products at 6 bits: the products whose int4
# costs the embedding most, measured one group at a time on the tests'
# tiny embedders (`export/embedder_int4_error.py`). Least cosine, seeds
# 0/1/2, lengths 8-32, all int4 -> value and output int8: Gemma3
# 0.983/0.995/0.996 -> 0.994/0.997/0.997; Qwen3 0.984/0.988/0.996 ->
# 0.999/1.000/1.000; BERT 1.0000 either way. Other levers measured there
# moved it less, or not the same way on every seed: the pooling
# projections int8, the first or last block int8, GPTQ's damping at 0.1 %
# or 10 %, act-order, the clip chosen on the Hessian.
INT8_LAYERS = ("value", "attention_output")


def is_text_embedder(model) -> bool:
    """Whether `model` is a keras-hub `TextEmbedder` (by its classes' names:
    keras-hub need not be imported)."""
    return any(c.__name__ == "TextEmbedder" for c in type(model).__mro__)


def name_of(embedder):
    return f"{type(embedder).__name__} {embedder.name!r}"


def check_embedder(embedder):
    """Raise `ValueError` naming the embedder where the engine cannot run
    it: inputs other than token ids, padding mask and segment ids (the
    engine feeds one text), or an output other than one vector per text."""
    if not is_text_embedder(embedder):
        raise TypeError(
            "to_litert_embedder: `embedder` is a keras-hub TextEmbedder "
            "(Gemma3TextEmbedder, Qwen3TextEmbedder, BertTextEmbedder, "
            f"XLMRobertaTextEmbedder). Received: {type(embedder).__name__}"
        )
    inputs = embedder.input
    names = sorted(inputs) if isinstance(inputs, dict) else None
    if names is None or "token_ids" not in names:
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} takes {type(inputs).__name__} "
            "inputs; LiteRT-LM's embedding engine feeds token ids only, so the "
            "embedder must take a dict with `token_ids` (and optionally "
            "`padding_mask`, `segment_ids`)."
        )
    extra = [n for n in names if n not in _INPUTS]
    if extra:
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} takes the input(s) {extra} "
            "besides token ids; LiteRT-LM's embedding engine feeds one text's "
            "tokens (no images, no second segment), so it cannot run it."
        )
    outputs = embedder.output
    shape = getattr(outputs, "shape", None)
    if shape is None or len(shape) != 2:
        shown = shape if shape is not None else type(outputs).__name__
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} outputs {shown}; LiteRT-LM's "
            "embedding engine reads one vector per text (batch, dim), so a "
            "pooling that keeps every token (or several outputs) cannot be "
            "written. Pool to one vector per text (pooling_mode='mean' or "
            "'last')."
        )
    vocabulary = _vocabulary_size(embedder)
    if vocabulary is not None and vocabulary > _EXACT_IDS:
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} has {vocabulary} tokens; "
            f"token ids travel as float32 in the bundle, exact below {_EXACT_IDS}."
        )
    return int(shape[-1])


def keras_tokenizer(embedder):
    return getattr(getattr(embedder, "preprocessor", None), "tokenizer", None)


def _vocabulary_size(embedder):
    backbone = getattr(embedder, "backbone", None)
    return getattr(backbone, "vocabulary_size", None)


def check_sequence_lengths(embedder, sequence_lengths, default=()):
    """`sequence_lengths` as a sorted tuple of distinct positive ints, each
    within the backbone's position table where it has one; None: `default`
    capped at that table."""
    limit = getattr(getattr(embedder, "backbone", None), "max_sequence_length", None)
    if sequence_lengths is None:
        if not isinstance(limit, int):
            return tuple(sorted(default))
        return tuple(sorted({min(t, limit) for t in default}))
    if isinstance(sequence_lengths, int):
        sequence_lengths = (sequence_lengths,)
    try:
        lengths = tuple(sequence_lengths)
    except TypeError:
        lengths = None
    if (
        not lengths
        or any(isinstance(t, bool) or not isinstance(t, int) or t < 2 for t in lengths)
        or len(set(lengths)) != len(lengths)
    ):
        raise ValueError(
            "to_litert_embedder: `sequence_lengths` is one or more distinct "
            "integers of at least 2 (a text's tokens with its BOS and EOS). "
            f"Received: sequence_lengths={sequence_lengths!r}"
        )
    if isinstance(limit, int) and max(lengths) > limit:
        raise ValueError(
            f"to_litert_embedder: {name_of(embedder)} has positions for "
            f"{limit} tokens. Received: sequence_lengths={sequence_lengths!r}"
        )
    return tuple(sorted(lengths))


def special_tokens(tokenizer):
    """`(bos, eos, pad)`: the ids keras-hub's embedder preprocessor packs a
    text with (its tokenizer's start, end and pad tokens; None where it has
    none)."""

    def get(attr):
        value = getattr(tokenizer, attr, None)
        return None if value is None else int(value)

    pad = get("pad_token_id")
    return get("start_token_id"), get("end_token_id"), 0 if pad is None else pad


def pack(ids, length, bos, eos):
    """A text's ids as the engine feeds them: BOS, the ids, EOS; past
    `length`, cut as the engine's truncation does (the last kept token
    replaced by EOS)."""
    tokens = ([bos] if bos is not None else []) + list(ids)
    tokens += [eos] if eos is not None else []
    if len(tokens) > length:
        tokens = tokens[:length]
        if eos is not None:
            tokens[-1] = eos
    return tokens


def keras_embeddings(embedder, rows, length, pad):
    """The Keras embedder's embeddings of `rows` (lists of packed ids) padded
    to `length`."""
    ids = np.full((len(rows), length), pad, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = True
    inputs = {"token_ids": ids, "padding_mask": mask}
    if "segment_ids" in embedder.input:
        inputs["segment_ids"] = np.zeros_like(ids)
    return np.asarray(embedder(inputs, training=False), np.float32)


def encoder_module(embedder, lengths, id_map=None):
    """A `tf.Module` with one `encoder_<T>` signature per length, taking
    `embeddings` (the ids as floats) and `input_mask`; `id_map` (an int32
    array): the embedder's id of each id the engine feeds."""
    import tensorflow as tf

    wants_segments = "segment_ids" in embedder.input
    mask_dtype = (
        embedder.input["padding_mask"].dtype
        if ("padding_mask" in embedder.input)
        else "int32"
    )

    functions = {}
    for length in lengths:

        def encoder(embeddings, input_mask):
            ids = tf.cast(tf.round(embeddings[..., 0]), tf.int32)
            if id_map is not None:
                ids = tf.gather(tf.constant(id_map), ids)
            inputs = {"token_ids": ids}
            if "padding_mask" in embedder.input:
                inputs["padding_mask"] = tf.cast(input_mask > 0.5, mask_dtype)
            if wants_segments:
                inputs["segment_ids"] = tf.zeros_like(ids)
            return {"embedding": embedder(inputs, training=False)}

        function = tf.function(
            encoder,
            input_signature=[
                tf.TensorSpec((1, length, 1), tf.float32, name="embeddings"),
                tf.TensorSpec((1, length), tf.float32, name="input_mask"),
            ],
        )
        functions[f"encoder_{length}"] = function.get_concrete_function()
    # The variables the signatures read, held once (`write.variables_module`).
    from kerasnorm.export.litert_lm.write import variables_module

    module = variables_module(functions.values())
    return module, functions


def convert(module, functions, verbose):
    import tensorflow as tf

    from kerasnorm.export.litert.convert import stderr_captured

    with tempfile.TemporaryDirectory(prefix="kerasnorm_embedder_") as tmp:
        tf.saved_model.save(module, tmp, signatures=functions)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            tmp, signature_keys=list(functions)
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.exclude_conversion_metadata = True
        try:
            with stderr_captured(not verbose):
                return converter.convert()
        except Exception as err:  # the converter's many error types
            raise ExportConversionError(
                "to_litert_embedder: LiteRT's converter could not write the "
                f"embedder with TFLite builtins: {str(err).splitlines()[0]}",
                details=str(err),
            ) from err


def lookup_model(verbose):
    """The EMBEDDER model: token id int32 `(1, 1)` -> the id as float32
    `(1, 1, 1)`."""
    import tensorflow as tf

    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec((1, 1), tf.int32, name="token_ids")])
    def embedder(token_ids):
        return {"embeddings": tf.cast(token_ids, tf.float32)[..., None]}

    return convert(module, {"embedder": embedder.get_concrete_function()}, verbose)


def file_embeddings(content, rows, length):
    """The TEXT_ENCODER's `encoder_<length>` embedding of each of `rows`
    (packed ids), fed as the engine feeds it."""
    from kerasnorm.export.litert.runner import interpreter

    interp = interpreter(content)
    runner = interp.get_signature_runner(f"encoder_{length}")
    out = []
    for row in rows:
        ids = np.zeros((1, length, 1), np.float32)
        mask = np.zeros((1, length), np.float32)
        ids[0, : len(row), 0] = row
        mask[0, : len(row)] = 1.0
        result = runner(embeddings=ids, input_mask=mask)
        out.append(np.asarray(result["embedding"], np.float32).reshape(-1))
    return np.stack(out)


def cosine(a, b):
    """Row-wise cosine similarity of two `(n, d)` arrays."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    dot = np.sum(a * b, axis=-1)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return dot / np.maximum(norms, 1e-30)


def calibration_inputs(embedder, tokenizer, special, length):
    """What GPTQ fits an int4 bundle's products to (`calibration.Calibration`):
    each product's inputs while the Keras embedder embeds
    `prompts.CALIBRATION_TEXTS` in its own tokenizer, each packed with BOS
    and EOS and cut into pieces of `length` tokens (the largest signature's,
    as the engine chunks a long text). Text held out from the check's
    sentences: fitted to them, GPTQ would flatter the check (as
    `prompts.calibration_prompts` says of the generative files)."""
    from kerasnorm.export.litert_lm.prompts import CALIBRATION_TEXTS
    from kerasnorm.export.weights.calibration import product_inputs

    bos, eos, pad = special
    pieces = []
    for text in CALIBRATION_TEXTS:
        ids = np.asarray(tokenizer(text)).reshape(-1).astype(int).tolist()
        tokens = pack(ids, 10**9, bos, eos)
        pieces += [tokens[i : i + length] for i in range(0, len(tokens), length)]
    return product_inputs(
        embedder, pieces, lambda row: keras_embeddings(embedder, [row], len(row), pad)
    )


def quantized_encoder(content, embedder, mode, special, length):
    """The TEXT_ENCODER `content` quantized (`mode`: the export's `quantize`,
    int4 block and refusal of an indivisible block), the products GPTQ
    rounded, and the layer paths of those written int8 per channel
    (`INT8_LAYERS`). Where the mode asks for GPTQ, the products are fitted
    to `calibration_inputs`."""
    from kerasnorm.export.weights.calibration import products_of_layers
    from kerasnorm.export.weights.quantize import quantize_weights

    quantize, block, indivisible = mode
    row = GENERATIVE_MODES[quantize]
    calibration, int8 = None, {}
    if row.gptq:
        tokenizer = keras_tokenizer(embedder)
        calibration = calibration_inputs(embedder, tokenizer, special, length)
    if row.gptq and row.products == INT4_BLOCKS:
        row = dataclasses.replace(row, lookup=TABLE_LOOKUP)
        int8 = products_of_layers(embedder, INT8_LAYERS)
        calibration.int8.update(int8)
    content = quantize_weights(
        content, row, block, indivisible=indivisible, calibration=calibration
    )
    paths = tuple(p for paths in int8.values() for p in paths)
    return content, tuple(getattr(calibration, "rounded", ())), paths
