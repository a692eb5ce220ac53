"""Speculative decoding in LiteRT-LM's engine: a Gemma 4 base trained on
the toy chat and its `Gemma4AssistantCausalLM` distilled on the base's
greedy tokens, bundled with `to_litert_lm(base, path, drafter=assistant)`,
then decoded greedily from every chat prompt with and without the drafter
(docs/guides/generation.md, "Speculative decoding").

    PYTHONPATH=$PWD python -m export.bench_speculative --width 256 --layers 6

Prints the export's own line (its check and its engine run on two plain
sentences) and, per round, the engine's acceptance rate ("MTP Drafter -
Success rate") and decode tokens per second with the drafter and without,
side by side on the same prompts, with the greedy replies (equal both ways,
or the run raises). `--width 32 --layers 4 --drafter-width 16 --epochs 12`
is the tests' pair.
"""

import argparse
import os
import sys
import tempfile
import time


def _base(directory, width, layers, epochs):
    from tests.export import lm_models

    if (width, layers) == (32, 4):  # the tests' configuration
        return lm_models.gemma4_chat_lm(directory, epochs=epochs)
    return lm_models.gemma4_chat_lm(
        directory,
        epochs=epochs,
        learning_rate=3e-3,
        hidden_dim=width,
        intermediate_dim=4 * width,
        num_layers=layers,
        head_dim=32,
        global_head_dim=64,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--drafter-width", type=int, default=64)
    parser.add_argument("--drafter-steps", type=int, default=300)
    parser.add_argument("--draft-steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from kerasnorm.export import to_litert_lm
    from kerasnorm.export.litert_lm.speculative import base_greedy
    from kerasnorm.export.litert_lm.speculative_engine import run_speculative
    from tests.export import drafter_models
    from tests.export import lm_models

    directory = tempfile.mkdtemp(prefix="kerasnorm-speculative-")
    began = time.perf_counter()
    base = _base(directory, args.width, args.layers, args.epochs)
    drafter = drafter_models.gemma4_assistant(
        base, hidden_dim=args.drafter_width, draft_steps=args.draft_steps
    )
    drafter_models.train_assistant(
        drafter, base, drafter_models.chat_token_ids(base), steps=args.drafter_steps
    )
    print(
        f"base {base.count_params():,} parameters, drafter "
        f"{drafter.count_params():,}, trained in {time.perf_counter() - began:.0f} s"
    )
    path = os.path.join(directory, "speculative.litertlm")
    context = 48
    result = to_litert_lm(
        base, path, max_sequence_length=context, prefill_lengths=(16,), drafter=drafter
    )
    print(result)
    texts = [lm_models.gemma4_turns(word) for word in lm_models.CHAT_WORDS]
    greedy = base_greedy(base, result.stop_tokens, context)
    for n in range(args.rounds):
        run = run_speculative(path, texts, greedy, args.tokens)
        ratio = run.speculative_tokens_per_second / run.plain_tokens_per_second
        print(
            f"round {n + 1}: acceptance {run.acceptance:.2f}, decode "
            f"{run.speculative_tokens_per_second:.1f} tokens/s with the drafter, "
            f"{run.plain_tokens_per_second:.1f} without ({ratio:.2f}x), "
            f"{run.tokens} tokens"
        )
    print("replies:", run.replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
