"""A speculative-decoding bundle's files checked against the two Keras
models before the bundle is written (`speculative.to_speculative_bundle`).

With the file's own embedders feeding the base as LiteRT-LM's engine feeds
it, each prompt is prefilled and decoded greedily: every step's `logits`
within `FLOAT32_TOLERANCE` of the largest of the base's full forward pass
(`check.reference_logits`), the same greedy tokens. Then `verify` runs on
the prompt's next `draft_steps + 1` tokens of that greedy sequence: its
`logits` rows within the same tolerance of the forward pass's, its
`activations` equal (to that tolerance, of the largest) to the hidden
states keras-hub's `generate()` hands its assistant (`call_with_cache`'s,
after the final norm). Then the drafter, at each of those positions, on
the caches `verify` wrote: `logits` and `projected_activations` against
keras-hub's `Gemma4AssistantCausalLM.call_with_cache` on the model's own
cache (with the base's logit soft cap, as `generate()` applies it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops

from kerasnorm._compat.hub_cache import empty_cache
from kerasnorm.export.litert.runner import interpreter
from kerasnorm.export.litert_lm.check import FLOAT32_TOLERANCE
from kerasnorm.export.litert_lm.check import reference_logits
from kerasnorm.export.litert_lm.speculative_files import DRAFTER_SIGNATURE
from kerasnorm.export.litert_lm.speculative_files import VERIFY
from kerasnorm.export.litert_lm.speculative_graph import source_layers
from kerasnorm.export.litert_lm.write import cache_names
from kerasnorm.export.numerics.errors import ExportVerificationError


@dataclasses.dataclass
class SpeculativeCheck:
    """The largest errors found, each relative to the largest reference
    value of its step: `decode`'s logits, `verify`'s logits and
    activations, the drafter's logits and projected activations."""

    prompts: int
    steps: int
    decode_error: float
    verify_error: float
    activations_error: float
    drafter_error: float
    projected_error: float
    tokens_equal: bool

    @property
    def max_error(self):
        return max(
            self.decode_error,
            self.verify_error,
            self.activations_error,
            self.drafter_error,
            self.projected_error,
        )

    def __str__(self):
        return (
            f"{self.steps} decode steps over {self.prompts} prompts: greedy "
            f"tokens {'equal' if self.tokens_equal else 'DIFFER'}, decode "
            f"{self.decode_error:.1e}, verify {self.verify_error:.1e} "
            f"(activations {self.activations_error:.1e}), drafter "
            f"{self.drafter_error:.1e} (projected {self.projected_error:.1e}) "
            "of the largest"
        )


def _relative(got, ref):
    ref = np.asarray(ref, np.float32)
    return float(np.abs(np.asarray(got) - ref).max() / max(np.abs(ref).max(), 1e-30))


class SpeculativeFileRunner:
    """The base, its embedders and the drafter run as the engine runs them
    (`SpeculativeFiles`), one interpreter each."""

    def __init__(self, files, max_sequence_length):
        self.files = files
        self.length = max_sequence_length
        self._base = interpreter(files.base)
        self._embed = interpreter(files.embedder)
        self._per_layer = interpreter(files.per_layer_embedder)
        self._drafter = interpreter(files.drafter).get_signature_runner(
            DRAFTER_SIGNATURE
        )
        self.names = cache_names(len(files.cache_shapes))
        self.caches = {}
        self.reset()

    def reset(self):
        self.caches = {}
        for n, (g, d) in enumerate(self.files.cache_shapes):
            for name in self.names[2 * n : 2 * n + 2]:
                self.caches[name] = np.zeros((1, g, self.length, d), np.float32)

    def embedded(self, ids):
        """`(embeddings, per_layer_embeddings)` of `ids`, a token at a time."""
        rows, per_layer = [], []
        for token in ids:
            x = np.array([[token]], np.int32)
            rows.append(self._lookup(self._embed, x)[0])
            per_layer.append(self._lookup(self._per_layer, x)[0])
        return np.concatenate(rows, 1), np.concatenate(per_layer, 1)

    @staticmethod
    def _lookup(interp, ids):
        (key,) = interp.get_signature_list()
        return list(interp.get_signature_runner(key)(token_ids=ids).values())

    def run(self, key, ids, start):
        """Signature `key` on `ids` at positions from `start` (padded to
        its length with token 0 at the positions after); the caches kept."""
        tokens = self.files.signatures[key]
        ids = list(ids) + [0] * (tokens - len(ids))
        embeddings, per_layer = self.embedded(ids)
        out = self._base.get_signature_runner(key)(
            embeddings=embeddings,
            per_layer_embeddings=per_layer,
            input_pos=np.arange(start, start + tokens, dtype=np.int32),
            **self.caches,
        )
        for name in self.names:
            self.caches[name] = out[name]
        return out

    def draft(self, token, activations, position):
        """The drafter on `token`'s embedding and the base's `activations`
        `(1, 1, D)` at `position`, over the caches held."""
        embedding, _ = self.embedded([token])
        reads = {}
        for j in self.files.drafter_caches:
            for name in self.names[2 * j : 2 * j + 2]:
                reads[name] = self.caches[name]
        out = self._drafter(
            activations=np.concatenate([embedding, activations], -1),
            input_pos=np.array([position], np.int32),
            **reads,
        )
        return out["logits"], out["projected_activations"]


def _hidden_and_cache(base, ids):
    """keras-hub's cached call over `ids` from an empty cache: its hidden
    states (what `generate()` hands the assistant) and its cache."""
    ids = np.asarray(ids, np.int32)[None]
    _, hidden, cache = base.call_with_cache(ids, empty_cache(base, ids.shape[1]), 0)
    return np.asarray(ops.convert_to_numpy(hidden), np.float32), cache


def _draft_reference(base, drafter, embedding, hidden, cache, position):
    sources = source_layers(base)
    logits, projected = drafter.call_with_cache(
        last_token_embedding=embedding,
        last_hidden_state=hidden,
        target_cache=cache,
        cache_update_index=position,
        target_kv_source_full_idx=sources.get("global"),
        target_kv_source_local_idx=sources.get("sliding"),
    )
    logits = np.asarray(ops.convert_to_numpy(logits), np.float32)
    if base.final_logit_cap is not None:
        cap = base.final_logit_cap
        logits = np.tanh(logits / cap) * cap
    return logits, np.asarray(ops.convert_to_numpy(projected), np.float32)


def check_speculative(base, drafter, files, prompts, *, max_sequence_length, new):
    """`SpeculativeCheck` of `files` on `prompts` (token id lists), `new`
    greedy tokens each; `ExportVerificationError` past the tolerance."""
    runner = SpeculativeFileRunner(files, files.cache_length)
    prefill = min(t for k, t in files.signatures.items() if k.startswith("prefill"))
    g = files.draft_steps
    errors = {k: [0.0] for k in ("decode", "verify", "act", "draft", "proj")}
    equal, steps = True, 0
    for prompt in prompts:
        prompt = [int(t) for t in prompt][: prefill + 1]
        runner.reset()
        n = len(prompt)
        prefill_key = next(k for k, t in files.signatures.items() if t == prefill)
        runner.run(prefill_key, prompt[:-1], 0)
        sequence = list(prompt)
        while len(sequence) < min(n + new, max_sequence_length - g - 1):
            position = len(sequence) - 1
            out = runner.run("decode", sequence[-1:], position)
            ref = reference_logits(base, np.array(sequence, np.int32))[position]
            got = out["logits"][0, 0]
            errors["decode"].append(_relative(got, ref))
            equal &= int(np.argmax(got)) == int(np.argmax(ref))
            sequence.append(int(np.argmax(ref)))
            steps += 1
        # verify: the last token and `g` more of the greedy sequence.
        start = len(sequence) - 1
        full = sequence + _greedy(base, sequence, g)
        out = runner.run(VERIFY, full[start : start + g + 1], start)
        ref = reference_logits(base, np.array(full, np.int32))[start : start + g + 1]
        hidden, cache = _hidden_and_cache(base, full)
        errors["verify"].append(_relative(out["logits"][0], ref))
        rows = hidden[0, start : start + g + 1]
        errors["act"].append(_relative(out["activations"][0], rows))
        embedded, _ = runner.embedded(full)
        for p in range(start, start + g):
            got = runner.draft(full[p + 1], out["activations"][:, p - start][None], p)
            ref = _draft_reference(
                base,
                drafter,
                embedded[:, p + 1 : p + 2],
                hidden[:, p : p + 1],
                cache,
                p,
            )
            errors["draft"].append(_relative(got[0], ref[0]))
            errors["proj"].append(_relative(got[1], ref[1]))
    result = SpeculativeCheck(
        prompts=len(prompts),
        steps=steps,
        decode_error=max(errors["decode"]),
        verify_error=max(errors["verify"]),
        activations_error=max(errors["act"]),
        drafter_error=max(errors["draft"]),
        projected_error=max(errors["proj"]),
        tokens_equal=bool(equal),
    )
    if result.max_error > FLOAT32_TOLERANCE or not result.tokens_equal:
        raise ExportVerificationError(
            "to_litert_lm: the speculative bundle's files do not compute "
            f"the models: {result} (tolerance {FLOAT32_TOLERANCE:g})."
        )
    return result


def _greedy(base, sequence, count):
    out = list(sequence)
    for _ in range(count):
        out.append(int(np.argmax(reference_logits(base, np.array(out, np.int32))[-1])))
    return out[len(sequence) :]
