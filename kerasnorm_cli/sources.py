"""What `kerasnorm export` reads, told apart without Keras: a `.keras`
file or a keras-hub preset folder (`save_to_preset`'s), whether the model
carries a preprocessor (whose tokenizer makes `--format litert_lm` write the
`.litertlm` bundle), and the bundle's flags, which need one (`--drafter`'s
preset folder among them)."""

import importlib.util
import json
import os
import zipfile

# The flags that only the .litertlm bundle reads, and their `args` names.
BUNDLE_FLAGS = (
    "--chat-template",
    "--start-token",
    "--no-start-token",
    "--stop-tokens",
    "--top-k",
    "--top-p",
    "--temperature",
)


# Flags that set another flag's option to False, and that option's name.
NEGATIONS = {"--no-start-token": "start_token"}


def given_flags(args, flags):
    """Those of `flags` given on the command line, in their order."""
    return [f for f in flags if _given(args, f)]


def _given(args, flag):
    name = NEGATIONS.get(flag, flag[2:].replace("-", "_"))
    value = getattr(args, name)
    if flag in NEGATIONS:
        return value is False
    # The option's False is its negation's.
    return value is not None and not (name in NEGATIONS.values() and value is False)


def bundle_flags(args):
    """What is wrong with the bundle's flags, once the model's source has
    passed its checks (whether it carries a preprocessor is read there)."""
    if "litert_lm" not in args.formats:
        return None
    if args.tokenizer is not None and not os.path.isfile(args.tokenizer):
        return f"--tokenizer file not found: {args.tokenizer!r}"
    if args.chat_template is not None and not os.path.isfile(args.chat_template):
        return f"--chat-template file not found: {args.chat_template!r}"
    if args.top_p is not None and args.top_p > 1:
        return f"--top-p is at most 1. Received: --top-p {args.top_p}"
    bundle = given_flags(args, BUNDLE_FLAGS)
    if bundle and not writes_bundle(args):
        return (
            f"{bundle[0]} applies to the .litertlm bundle, which needs a "
            "tokenizer: pass --tokenizer FILE, or export a CausalLM that "
            "carries its preprocessor (a keras-hub preset folder, or a .keras "
            "file saved with it)."
        )
    if args.tokenizer and importlib.util.find_spec("litert_lm_builder") is None:
        return (
            "--tokenizer writes a .litertlm bundle, which needs "
            "litert-lm-builder (not installed). Install it with "
            '`pip install "kerasnorm[litert_lm]"`. Nothing was written.'
        )
    return None


def writes_bundle(args):
    """Whether `--format litert_lm` writes the LiteRT-LM bundle: with
    `--tokenizer`, or for a model that carries its preprocessor (its
    tokenizer goes into the bundle) when litert-lm-builder is installed."""
    if args.tokenizer is not None:
        return True
    return importlib.util.find_spec("litert_lm_builder") is not None and (
        carries_preprocessor(args.model)
    )


def is_preset(path):
    """Whether `path` is a keras-hub preset folder (`save_to_preset`'s:
    `config.json` and `metadata.json` in a directory)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def carries_preprocessor(path):
    """Whether the model at `path` (a preset folder or a `.keras` file,
    already checked) carries a preprocessor, read without Keras."""
    if is_preset(path):
        return os.path.isfile(os.path.join(path, "preprocessor.json"))
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    inner = config.get("config") if isinstance(config, dict) else None
    return isinstance(inner, dict) and bool(inner.get("preprocessor"))


def model_name(path):
    """The artifacts' base name: the `.keras` file's name without its
    suffix, or the preset folder's name."""
    path = os.path.normpath(path)
    if is_preset(path):
        return os.path.basename(os.path.abspath(path))
    return os.path.splitext(os.path.basename(path))[0]


def check_preset(path, give="Give a .keras file or a preset folder."):
    """What is wrong with the keras-hub preset folder at `path`, or None;
    `give` says what to give instead."""
    missing = [
        name
        for name in ("config.json", "metadata.json")
        if not os.path.isfile(os.path.join(path, name))
    ]
    if missing:
        return (
            f"{path!r} is a directory but not a keras-hub preset folder (no "
            f"{' or '.join(missing)}; `save_to_preset(DIR)` writes one). {give}"
        )
    for name in ("config.json", "task.json", "preprocessor.json"):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:
            with open(file, encoding="utf-8") as f:
                json.load(f)
        except (OSError, ValueError) as err:
            return f"{path!r}: its {name} is not valid JSON ({err})."
    return None


def check_drafter(args):
    """What is wrong with `--drafter` (a Gemma 4 base's assistant, bundled
    beside it in the `.litertlm` bundle), or None. Its class is judged
    once it is loaded (`to_litert_lm`'s refusal)."""
    path = args.drafter
    if path is None:
        return None
    if not os.path.isdir(path):
        return (
            "--drafter is the keras-hub preset folder of a Gemma4AssistantCausalLM "
            f"(its save_to_preset(DIR)). Received: {path!r}, not a folder."
        )
    problem = check_preset(
        path, "Give the assistant's folder: Gemma4AssistantCausalLM.save_to_preset."
    )
    if problem:
        return f"--drafter {problem}"
    unused = [
        flag
        for flag, value in (
            ("--quantize", args.quantize),
            ("--min-agreement", args.min_agreement),
            ("--smooth", args.smooth),
            ("--lora runtime", args.lora == "runtime"),
            ("--lora-rank", args.lora_rank),
        )
        if value
    ]
    if unused:
        return (
            "--drafter: a bundle with a drafter is written in float32 with its "
            f"base's decode logits; it takes no {unused[0]}."
        )
    if not writes_bundle(args):
        return (
            "--drafter goes into the .litertlm bundle beside its base (its "
            "MTP_DRAFTER section), and this export writes a .tflite: the "
            "bundle needs a tokenizer (--tokenizer FILE, or a base saved with "
            "its preprocessor) and litert-lm-builder "
            '(`pip install "kerasnorm[litert_lm]"`). Nothing was written.'
        )
    return None
