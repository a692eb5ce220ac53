"""The `.litertlm` side of `to_litert_lm`: the bundle's options checked
before any work, the bundle written (`bundle.write_bundle`) and run once in
LiteRT-LM's engine (`engine.run_in_engine`), the engine's tokens of its
sample checked against the model's keras-hub tokenizer, and the line per
stage the export prints."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from kerasnorm.export.numerics.errors import ExportVerificationError


def check_bundle_options(options, path, bundle_file, model):
    """Before any work: the bundle's options refused on a `.tflite` path,
    the sampler defaults and the chat template checked, a bundle of a model
    without a tokenizer refused."""
    if bundle_file and options.tokenizer is None and _preprocessor(model) is None:
        raise ValueError(
            f"to_litert_lm: a `.litertlm` bundle holds a tokenizer, and "
            f"{model.name!r} has no preprocessor to take one from: pass "
            "tokenizer= a SentencePiece model or tokenizer.json path, or "
            "write a `.tflite` path."
        )
    given = {
        name: getattr(options, name)
        for name in BUNDLE_OPTIONS
        if getattr(options, name) is not None
    }
    if not bundle_file and given:
        name = next(iter(given))
        raise ValueError(
            f"to_litert_lm: `{name}` is the `.litertlm` bundle's; a `.tflite` "
            f"path holds the model file only. Write a `.litertlm` path or drop "
            f"{name}=. Received: path={os.fspath(path)!r}"
        )
    if bundle_file:
        from kerasnorm.export.litert_lm import bundle
        from kerasnorm.export.litert_lm.chat import user_template

        bundle.check_sampler(options.top_k, options.top_p, options.temperature)
        user_template(options.chat_template)


def _with_adapter(engine, lora, given, chat, zeros=False):
    """The bundle's run in the engine fed the model's own adapter file
    (`write_lora_adapter`'s bytes, in a temporary file), or the zero one
    (the base model: without an adapter LiteRT-LM 0.18.1 leaves the inputs
    unset)."""
    from kerasnorm.export.litert_lm.adapter_file import adapter_bytes

    tensors = lora.zeros() if zeros else lora.tensors()
    with tempfile.TemporaryDirectory(prefix="kerasnorm-adapter-") as directory:
        adapter = os.path.join(directory, "adapter.tflite")
        with open(adapter, "wb") as f:
            f.write(adapter_bytes(tensors, lora.rank))
        return engine.run_in_engine(
            *given, chat=chat.template is not None, lora=(lora.rank, adapter, tensors)
        )


def _preprocessor(model):
    return getattr(model, "preprocessor", None)


# The options only a `.litertlm` bundle takes.
BUNDLE_OPTIONS = (
    "start_token",
    "stop_tokens",
    "chat_template",
    "top_k",
    "top_p",
    "temperature",
)


def stages(options):
    """A function printing one line per stage, when `progress` or `verbose`
    asks for them."""

    def say(line):
        if options.progress or options.verbose:
            print(line, flush=True)

    return say


def write_checked_bundle(model, options, content, tmp, path, say, lora=None):
    """Write the bundle at `tmp` and run it in LiteRT-LM's engine when it is
    installed; the result's bundle fields. `lora` (`runtime_lora`): the
    engine runs the bundle with the model's adapter, then without."""
    from kerasnorm.export.litert_lm import bundle
    from kerasnorm.export.litert_lm import engine

    say("Bundling the file, the tokenizer and the chat metadata into a .litertlm.")
    resolved, chat = bundle.write_bundle(
        content,
        tmp,
        model=model,
        tokenizer=options.tokenizer,
        max_sequence_length=options.max_sequence_length,
        start_token=options.start_token,
        stop_tokens=options.stop_tokens,
        chat_template=options.chat_template,
        top_k=options.top_k,
        top_p=options.top_p,
        temperature=options.temperature,
    )
    run = None
    if engine.engine_installed():
        say("Running the bundle once in LiteRT-LM's engine (a child process).")
        given = (tmp, content, resolved.stop_tokens, os.fspath(path))
        run = None if lora is None else _with_adapter(engine, lora, given, chat)
        if lora is None:
            base = engine.run_in_engine(*given, chat=chat.template is not None)
        else:
            base = _with_adapter(engine, lora, given, chat, zeros=True)
        same_tokens(model, options.tokenizer, base)
        said = str(base) if run is None else f"with its adapter {run}; without, {base}"
        run = run or base
    else:
        said = (
            "not run in LiteRT-LM's engine: litert-lm-api is not installed "
            "(pip install 'kerasnorm[litert_lm]' runs it)"
        )
    return {
        "model_type": chat.model_type,
        "chat_template": chat.template,
        "chat": chat.note,
        "start_token": resolved.start_token,
        "stop_tokens": resolved.stop_tokens,
        "engine_run": run,
        "engine": said,
    }


def same_tokens(model, tokenizer, run):
    """Raise `ExportVerificationError` unless keras-hub's tokenizer (the
    model's preprocessor's, when the bundle took it) tokenizes the engine's
    sample text as the engine did."""
    keras_hub_tokenizer = getattr(
        getattr(model, "preprocessor", None), "tokenizer", None
    )
    if tokenizer is not None or keras_hub_tokenizer is None:
        return
    theirs = [int(i) for i in np.asarray(keras_hub_tokenizer.tokenize(run.text))]
    ours = run.text_ids
    if ours != theirs:
        raise ExportVerificationError(
            f"to_litert_lm: LiteRT-LM's engine tokenizes {run.text!r} as "
            f"{ours} with the bundle's tokenizer, and keras-hub's "
            f"{type(keras_hub_tokenizer).__name__} as {theirs}: the bundle "
            "would not read prompts as the model was trained. The bundle was "
            "not written."
        )
