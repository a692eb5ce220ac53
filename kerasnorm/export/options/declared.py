"""Every export option, declared once: its name, default, documentation and
command-line flag.

The doors (`export`, `to_tflite`, `to_saved_model`) name their arguments
explicitly, for readers and editors; tests/export/test_options_declared.py
fails when a door's signature, its docstring's argument entry or a flag of
`kerasnorm export` differs from the declaration here. Each format takes the
options its row lists (`formats.Format.options`).
"""

from __future__ import annotations

import dataclasses

from kerasnorm.export.options.generative_modes import quantize_docs
from kerasnorm.export.options.modes import MAX_UNROLL_STEPS


@dataclasses.dataclass(frozen=True)
class Option:
    """One export option. `doc` is its entry in the doors' `Args:`
    (without the name); `flag` its `kerasnorm export` flag (None: none),
    `flag_default` the flag's default where the command's differs,
    `negation` a flag that sets it to `False`."""

    name: str
    default: object
    doc: str
    flag: str | None = None
    flag_default: object = None
    negation: str | None = None
    # A format's own entry where the shared `doc` does not say what the
    # option means for it (format name -> entry).
    format_docs: tuple = ()

    def doc_for(self, format_name):
        """The option's `Args:` entry in `format_name`'s shortcut."""
        return dict(self.format_docs).get(format_name, self.doc)


_DECLARED = (
    Option(
        "fold",
        True,
        "fold BatchNorm into adjacent layers first (`fold_batchnorm`), and for "
        "a float32 `.tflite` file (`quantize=None`) the norms' gains and "
        "offsets into the linear layer after them where that is exact "
        "(`ExportResult.fold_report.affines`; docs/design.md §4). Defaults to "
        "`True`.",
        flag="--no-fold",
        flag_default=False,
    ),
    Option(
        "quantize",
        None,
        '`None`, `"float16"`, `"dynamic"`, `"int8"` or `"int16x8"`. Defaults '
        "to `None`.",
        flag="--quantize",
        flag_default=[],
        format_docs=(("litert_lm", quantize_docs()),),
    ),
    Option(
        "representative_data",
        None,
        'calibration inputs for `"int8"` (an array, a list of arrays in '
        "`model.inputs` order, a dict by input name, or a `tf.data.Dataset` of "
        "any of these), batch first. Also used for verification when "
        "`verify_inputs` is None. Defaults to `None`.",
        flag="--calibration",
    ),
    Option(
        "int8_io",
        False,
        'with `"int8"`, write the full-integer file instead of the fast one: '
        "every op int8, the model's input and output tensors int8 too (no "
        "float boundary ops, no ops in float). Defaults to `False`.",
        flag="--int8-io",
    ),
    Option(
        "calibration_samples",
        None,
        "at most this many samples of `representative_data` calibrate "
        '`"int8"` / `"int16x8"` (for a streaming step, time steps: frames with '
        "the states the float model reaches there, spread over the sequences). "
        "Defaults to `None`: 200, and 4000 for the fast streaming int8 step, "
        "whose int8 matmul inputs need a few thousand steps (docs/design.md, "
        "§11, has the figures).",
    ),
    Option(
        "batch_size",
        None,
        "fix the artifact's batch. Defaults to `None`: dynamic (a `.tflite` "
        'file: 1 for a model with a recurrent layer, and for `"int8"` / '
        '`"int16x8"`).',
        flag="--batch-size",
    ),
    Option(
        "input_signature",
        None,
        "fix dimensions the model leaves undefined, in the forms Keras' "
        "`model.export(..., input_signature=...)` takes: `keras.InputSpec` / "
        "`tf.TensorSpec` per input, as a list in `model.inputs` order (or "
        "Keras' one-element list of the input structure), a dict by input "
        "name, or one spec for a one-input model; a plain shape tuple works "
        'too, e.g. `{"tokens": (None, 128)}`. `None` in a spec keeps that '
        "dimension dynamic; the dtype and the dimensions the model defines are "
        "the model's. Not with `streaming`. Defaults to `None`.",
    ),
    Option(
        "overwrite",
        False,
        "replace an existing file or version directory. Defaults to `False`.",
        flag="--force",
        format_docs=(("litert_lm", "replace an existing file. Defaults to `False`."),),
    ),
    Option(
        "verify_inputs",
        None,
        "inputs for every check, all of them used, in any form `model_inputs` "
        "takes: the fold's self-check and the parity checks (against the "
        "model, and against the original of a rebuilt one), whole or "
        "streaming; best a held-out set. Defaults to the first "
        "`VERIFY_SAMPLES` (256) samples of `representative_data`, else 32 "
        "random samples (`fold_batchnorm` says how they are made), which say "
        "little about real data; `verification.checked_on` says which.",
        flag="--verify-data",
        format_docs=(
            (
                "litert_lm",
                "prompts (sequences of token ids) to check with. Defaults to "
                "`None`: a few English sentences in the model's own tokenizer "
                "(a keras-hub CausalLM with a preprocessor), else two prompts "
                "of random ids; `result.check.source` says which.",
            ),
        ),
    ),
    Option(
        "tolerance",
        None,
        "the parity tolerance (see `DEFAULT_TOLERANCE` for what is compared in "
        "each mode). Defaults to `DEFAULT_TOLERANCE[quantize]` (`1e-4` of the "
        "output scale for a float artifact).",
    ),
    Option(
        "progress",
        False,
        "print a line naming the mode and the calibration sample count during "
        '`"int8"` / `"int16x8"` calibration, and on a terminal a progress bar '
        "(not when piped). Defaults to `False`.",
        format_docs=(
            (
                "litert_lm",
                "print a line per stage (tracing and converting, verifying, "
                "bundling, running in LiteRT-LM's engine). Defaults to `False`.",
            ),
        ),
    ),
    Option(
        "verbose",
        False,
        "let the TFLite converter's own log through to stderr. Defaults to `False`.",
        flag="--verbose",
        format_docs=(
            (
                "litert_lm",
                "show the converter's log and a line per stage. Defaults to `False`.",
            ),
        ),
    ),
    Option(
        "streaming",
        False,
        "write one time step of a sequence model instead: inputs `x` (one "
        "frame) and the recurrent states `state_<layer>_<i>`, outputs "
        "`output_<i>` and the new states under the same names, verified by "
        "running it over the sequences from zero states (int8 calibrates on "
        "the states the float model reaches). Layers that mix time steps are "
        "refused. `litert.StreamingRunner` runs the `.tflite` step. "
        "`verify_inputs` are then sequences `(N, time, features)`; a token "
        "model (integer ids `(batch, time)` into an `Embedding`) streams one "
        "id per call, `x` of shape `(batch,)`, its mask (`mask_zero=True`) "
        "followed as Keras follows it. Defaults to `False`.",
        flag="--streaming",
    ),
    Option(
        "export_dtype",
        "float32",
        '`"float32"` or `"float16"`. A model under a `mixed_float16` / '
        "`mixed_bfloat16` policy is exported from a float32 copy of its graph "
        'with the same weights (the result\'s `rebuilt_from`); `"float16"` '
        "keeps float16 compute in a SavedModel (a copy rebuilt under "
        "`mixed_float16`, for GPU serving) and stores float16 weights in a "
        '`.tflite` file (`quantize="float16"`, which GPU delegates run in '
        "float16; other quantize modes are refused with it). Defaults to "
        '`"float32"`.',
        flag="--export-dtype",
    ),
    Option(
        "max_unroll_steps",
        MAX_UNROLL_STEPS,
        'with `"int8"` / `"int16x8"`, the longest sequence a rolled recurrent '
        "layer is unrolled over; a longer one is refused (converter time and "
        "file size grow with each step). A streaming step unrolls nothing: "
        "with `streaming=True` any other value than the default is refused. "
        f"Defaults to {MAX_UNROLL_STEPS}.",
        flag="--max-unroll-steps",
    ),
    Option(
        "smooth",
        None,
        'with `"int8"` or `"dynamic"`, move outlier channels of each norm\'s '
        "output into the linear layers that read it, folded into the norm's "
        "gain (the same function in float; int8 then rounds the other "
        "channels finer): `True` searches the migration strength per norm on "
        "`representative_data`, a float in [0, 1] sets it. kerasnorm's norms "
        "and Keras' `LayerNormalization` read only by linear layers, and "
        "keras-hub's decoder blocks; `ExportResult.smoothed` lists the norms. "
        "Needs `representative_data`; refused with other modes and "
        "`streaming`. Defaults to `None` (off).",
        flag="--smooth",
        format_docs=(
            (
                "litert_lm",
                'with `quantize="dynamic"`, `"weight_only_int8"` or `"int4"`, resca'
                "le per channel each norm read only by linear products (the attenti"
                "on's query, key and value; a gated feed-forward's gate and up) and"
                " each gated feed-forward's down product (the up product's output t"
                "aking the scale), while the file is written: the same function in "
                "float, the int8 rounding then meeting channels of one range. The s"
                "trength is searched per site on the check's prompts against the mo"
                "de's product; `result.smoothed` lists the sites, `result.smoothing"
                "` says what was done or why not. `True` searches, a float in [0, 1"
                "] sets the strength, `False` turns it off. Defaults to `None`: on "
                'for `"dynamic"` and `"int4"`.',
            ),
        ),
    ),
    Option(
        "version",
        None,
        "the SavedModel's positive integer version. Defaults to `None`: one "
        "more than the highest version already in `path` (1 in an empty "
        "directory).",
        flag="--version",
        flag_default=1,
    ),
    Option(
        "max_sequence_length",
        None,
        "the cache length L: prompt plus generated tokens (required).",
        flag="--max-sequence-length",
    ),
    Option(
        "prefill_lengths",
        None,
        "the prefill signatures' token counts. Defaults to `None`, meaning "
        "`(16, 128)` capped at `max_sequence_length`.",
        flag="--prefill-lengths",
    ),
    Option(
        "prefill_logits",
        None,
        'what each prefill signature returns besides the caches: `"last"`, '
        "the logits of its last row only `(1, 1, vocab)` (the head multiplies "
        "one row; LiteRT-LM's engine reads logits from `decode`), "
        '`"all"`, every row\'s `(1, T, vocab)` (for scoring a prompt), or '
        '`"none"`, the caches only (as litert-torch writes: the last '
        "layer's feed-forward and the head are not computed). Defaults to "
        '`None`: `"none"` in a `.litertlm` bundle (the engine reads logits '
        'from `decode` only), `"last"` in a `.tflite` file.',
    ),
    Option(
        "int4_block_size",
        None,
        'with `quantize="int4"`, the weights\' block along the input '
        "dimension (one scale per block): 32, 64, 128 or 256; a product it "
        "does not divide takes the largest smaller one that does, or int8 "
        "(`int4_fallbacks` lists it). Defaults to `None`, meaning 32.",
    ),
    Option(
        "min_agreement",
        None,
        "with a quantized mode, the teacher-forced top-1 agreement with the "
        "model (a fraction in (0, 1]) at which the file is written: a stated "
        "acceptance, e.g. the agreement a refusal reported. The rms error "
        "bound of the mode still holds. Defaults to `None`: the mode's "
        "threshold (0.9).",
        flag="--min-agreement",
    ),
    Option(
        "lora",
        "merge",
        'LoRA `"merge"`d into the weights, or `"runtime"`: LiteRT-LM\'s adapter '
        'inputs on the base weights (`write_lora_adapter`). Defaults to `"merge"`.',
        flag="--lora",
    ),
    Option(
        "lora_rank",
        None,
        'with `lora="runtime"`, the adapter rank the file takes. Defaults to `None`.',
        flag="--lora-rank",
    ),
    Option(
        "tokenizer",
        None,
        "a SentencePiece model or `tokenizer.json` path, for a `.litertlm` (a "
        "keras-hub CausalLM's preprocessor's otherwise). Defaults to `None`.",
        flag="--tokenizer",
    ),
    # The `.litertlm` bundle's tokens, chat template, sampler (`litert_lm.bundle`).
    Option(
        "start_token",
        None,
        "the token (id or text) LiteRT-LM's engine prepends to a prompt, "
        "overriding the tokenizer's; `False`: none. Defaults to `None` (the "
        "tokenizer's).",
        flag="--start-token",
        negation="--no-start-token",
    ),
    Option(
        "stop_tokens",
        None,
        "the token(s) (ids or texts) that end a generation, overriding the "
        "tokenizer's end token and the family's end-of-turn token. Defaults "
        "to `None` (those).",
        flag="--stop-tokens",
    ),
    Option(
        "chat_template",
        None,
        "the bundle's Jinja chat template (a string, or a file's path) that "
        "the engine's conversation API renders messages with (a Hugging Face "
        "one is written to read the engine's content parts: "
        "docs/guides/chat.md). Defaults to `None`: the family's turn format, "
        "or the one whose tokens the tokenizer holds.",
        flag="--chat-template",
    ),
    Option(
        "drafter",
        None,
        "a keras-hub `Gemma4AssistantCausalLM` for `model`, bundled as its "
        'MTP_DRAFTER section (the generation guide\'s "Speculative decoding"). '
        "Defaults to `None`.",
        flag="--drafter",
    ),
    Option(
        "top_k",
        None,
        "the engine's default top-k sampling. Defaults to `None` (the engine's).",
        flag="--top-k",
    ),
    Option(
        "top_p",
        None,
        "the engine's default top-p sampling. Defaults to `None` (the engine's).",
        flag="--top-p",
    ),
    Option(
        "temperature",
        None,
        "the engine's default sampling temperature. Defaults to `None` (the engine's).",
        flag="--temperature",
    ),
)
OPTIONS = {option.name: option for option in _DECLARED}
DEFAULTS = {option.name: option.default for option in _DECLARED}
# What every format takes, and what a `.tflite` file takes besides.
SHARED_OPTIONS = (
    "fold",
    "batch_size",
    "input_signature",
    "overwrite",
    "verify_inputs",
    "tolerance",
    "streaming",
    "export_dtype",
)
TFLITE_OPTIONS = (
    "quantize",
    "representative_data",
    "int8_io",
    "calibration_samples",
    "progress",
    "verbose",
    "max_unroll_steps",
    "smooth",
)
