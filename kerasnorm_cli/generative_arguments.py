"""`kerasnorm export`'s flags for a language model's generative file and
its `.litertlm` bundle (`--format litert_lm`); standard library only."""


def _token(text):
    """A token flag's value: an id (digits) or the token's text."""
    return int(text) if text.isdigit() else text


def add_generative_flags(parser, positive):
    """Add the `--format litert_lm` flags to `parser`; `positive(kind)` is
    the parsers' argparse type of a number above 0."""
    parser.add_argument(
        "--max-sequence-length",
        type=positive(int),
        metavar="N",
        help="--format litert_lm: the cache length (prompt plus generated "
        "tokens); required there",
    )
    parser.add_argument(
        "--prefill-lengths",
        type=positive(int),
        nargs="+",
        metavar="T",
        help="--format litert_lm: the prefill signatures' token counts "
        "(default: 16 128, capped at --max-sequence-length)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="--format litert_lm: a SentencePiece .model or tokenizer.json "
        "for the LiteRT-LM bundle DIR/<name>.litertlm (default: the model's "
        "preprocessor's tokenizer, when it carries one)",
    )
    parser.add_argument(
        "--min-agreement",
        type=positive(float),
        metavar="A",
        help="--format litert_lm, with --quantize: write the quantized file "
        "when its teacher-forced top-1 agreement with the model reaches A, "
        "in (0, 1] (default: the mode's threshold, 0.9); a refusal reports "
        "the agreement reached",
    )
    parser.add_argument(
        "--lora",
        choices=("merge", "runtime"),
        help="--format litert_lm, a model fine-tuned with LoRA: merge the "
        "adapters into the weights (default), or write the base weights with "
        "LiteRT-LM's adapter inputs (runtime; the adapters: kerasnorm "
        "export-adapter)",
    )
    parser.add_argument(
        "--lora-weights",
        metavar="FILE.lora.h5",
        help="--format litert_lm: the LoRA adapters (backbone.save_lora_weights) "
        "loaded into MODEL, the base model (Keras saves a LoRA model's kernels "
        "merged, without its adapters)",
    )
    parser.add_argument(
        "--lora-rank",
        type=positive(int),
        metavar="R",
        help="--format litert_lm --lora runtime: the adapter rank the file "
        "takes (default: the model's)",
    )
    parser.add_argument(
        "--drafter",
        metavar="DIR",
        help="--format litert_lm, a Gemma 4 base: its Gemma4AssistantCausalLM's "
        "keras-hub preset folder (save_to_preset's), bundled beside it as the "
        "MTP drafter LiteRT-LM's engine decodes speculatively with (float32; "
        "the .litertlm bundle only)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="--format litert_lm: the bundle's Jinja chat template (default: "
        "the family's turn format: Gemma, Qwen, Llama 3)",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--start-token",
        metavar="TOKEN",
        type=_token,
        help="--format litert_lm: the token (id or text) the engine prepends "
        "to a prompt (default: the tokenizer's)",
    )
    start.add_argument(
        "--no-start-token",
        dest="start_token",
        action="store_const",
        const=False,
        help="--format litert_lm: the engine prepends no token to a prompt "
        "(for a model trained without one where keras-hub's generate() adds "
        "its tokenizer's)",
    )
    parser.add_argument(
        "--stop-tokens",
        metavar="TOKEN",
        type=_token,
        nargs="+",
        help="--format litert_lm: the token(s) (ids or texts) that end a "
        "generation (default: the tokenizer's end token and the family's "
        "end-of-turn token)",
    )
    parser.add_argument(
        "--top-k",
        type=positive(int),
        metavar="K",
        help="--format litert_lm: the bundle's default top-k sampling",
    )
    parser.add_argument(
        "--top-p",
        type=positive(float),
        metavar="P",
        help="--format litert_lm: the bundle's default top-p sampling, in (0, 1]",
    )
    parser.add_argument(
        "--temperature",
        type=positive(float),
        metavar="T",
        help="--format litert_lm: the bundle's default sampling temperature",
    )
