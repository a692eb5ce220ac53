"""`Generator`: text generation from a generative `.tflite` (prefill + decode
signatures over per-layer key/value caches, `kerasnorm.export.to_litert_lm`).
"""

from __future__ import annotations

import re

import numpy as np

from kerasnorm.export.litert.signatures import signature_runners

_PREFILL = re.compile(r"^prefill(?:_(\d+))?$")
LORA_PREFIX = "lora_"  # LiteRT-LM's adapter inputs


class Generator:
    """Prompt ids to a greedy or top-k continuation.

    The signatures run on one packed copy of the weights where the installed
    LiteRT has an XNNPACK weight cache (`litert.signatures`), else on one
    interpreter.

    The caches live between calls: `prefill(ids)` starts a sequence (at
    position 0), `decode(token)` appends one token; each returns the logits
    of the last token. `generate(ids, max_new_tokens)` does both. A prompt
    shorter than the prefill signature's length is padded at its end (the
    padding is masked and overwritten later); a longer one is fed in chunks.
    A file whose prefill returns only its last row's logits (`to_litert_lm`'s
    default, `prefill_logits="last"`) gets a prompt's last id through
    `decode` unless the prompt's last chunk fills its signature; one whose
    prefills return the caches only (`prefill_logits="none"`, litert-torch's
    files) always does, as LiteRT-LM's engine does. A file with LiteRT-LM's
    adapter inputs (`to_litert_lm(..., lora="runtime")`) is fed `adapter`
    (`{input name: array}`, e.g. `read_adapter`'s tensors) and zeros for
    the inputs it lacks, as the engine feeds them. `delegated=False` runs
    the file on LiteRT's built-in kernels, without XNNPACK: a file whose
    weights XNNPACK holds dequantized to float32 (weight-only int8,
    float16) then holds one float32 copy of them, not one unpacked and one
    packed per signature (`GenerativeMode.unpacked`).

    ```
    from kerasnorm.export import litert

    generator = litert.Generator(open("model.tflite", "rb").read())
    ids = generator.generate([1, 5, 9], max_new_tokens=12)        # greedy
    ids = generator.generate([1, 5, 9], 12, top_k=40, seed=0)      # sampled
    ```
    """

    def __init__(self, content: bytes, adapter=None, delegated=True):
        self._runners = signature_runners(content, delegated)
        signatures = list(self._runners)
        if "decode" not in signatures:
            raise ValueError(
                "Generator: the file has no `decode` signature; write it with "
                "kerasnorm.export.to_litert_lm. Signatures found: "
                f"{sorted(signatures)}"
            )
        self.prefill_lengths = {}
        decode_inputs = self._runners["decode"].get_input_details()
        rows, none = [], []
        for key in signatures:
            match = _PREFILL.match(key)
            if match:
                length = self._runners[key].get_input_details()["tokens"]["shape"][1]
                self.prefill_lengths[int(length)] = key
                logits = self._runners[key].get_output_details().get("logits")
                none.append(logits is None)
                rows.append(logits is not None and logits["shape"][1] == length)
        # Whether the prefills return every row's logits (`prefill_logits=
        # "all"`), their last row's only, or none (the caches only).
        self.all_rows = all(rows)
        self.prefill_returns_logits = not any(none)
        self.cache_names = sorted(
            (n for n in decode_inputs if n.startswith("kv_cache_")),
            key=lambda n: (int(n.rsplit("_", 1)[1]), n),
        )
        self.vocabulary_size = int(
            self._runners["decode"].get_output_details()["logits"]["shape"][-1]
        )
        shape = decode_inputs[self.cache_names[0]]["shape"]
        self.max_sequence_length = int(shape[2])
        self._cache_shapes = {n: decode_inputs[n]["shape"] for n in self.cache_names}
        adapter = dict(adapter or {})
        self._adapter = {
            key: {
                name: np.asarray(adapter.get(name, np.zeros(d["shape"])), np.float32)
                for name, d in runner.get_input_details().items()
                if name.startswith(LORA_PREFIX)
            }
            for key, runner in self._runners.items()
        }
        self.reset()

    def reset(self) -> None:
        """Empty the caches: the next call starts a new sequence."""
        self._caches = {
            n: np.zeros(s, np.float32) for n, s in self._cache_shapes.items()
        }
        self.position = 0

    def _run(self, key, tokens, start):
        positions = np.arange(start, start + len(tokens), dtype=np.int32)
        out = self._runners[key](
            tokens=np.asarray(tokens, np.int32)[None],
            input_pos=positions,
            **self._caches,
            **self._adapter[key],
        )
        self._caches = {n: out[n] for n in self.cache_names}
        return out["logits"][0] if "logits" in out else None

    def call_signature(self, key, ids) -> np.ndarray:
        """Call signature `key` on `ids` (its full length) at the current
        position; the logits rows it returns (None: a prefill that returns
        the caches only). The caches advance."""
        self._check_room(len(ids))
        logits = self._run(key, [int(i) for i in ids], self.position)
        self.position += len(ids)
        return logits

    def _check_room(self, count):
        if self.position + count > self.max_sequence_length:
            raise ValueError(
                f"The sequence would reach {self.position + count} tokens, more "
                f"than the file's max_sequence_length={self.max_sequence_length}"
                ": export with a larger max_sequence_length, or shorten the "
                "prompt or max_new_tokens."
            )

    def prefill(self, ids) -> np.ndarray:
        """Start a sequence with `ids`; the logits `(T, vocab)` of every id
        (`all_rows` files), or `(1, vocab)` of the last id."""
        ids = [int(i) for i in ids]
        self.reset()
        self._check_room(len(ids))
        rows, fed = [], 0
        while fed < len(ids):
            rest = ids[fed:]
            fits = [
                t
                for t in self.prefill_lengths
                if self.position + t <= self.max_sequence_length
            ]
            last_by_decode = len(rest) == 1 and (
                min(fits or [0]) > 1 or not self.prefill_returns_logits
            )
            if not fits or last_by_decode:
                rows.append(self.decode(rest[0]))
                fed += 1
                continue
            enough = [t for t in fits if t >= len(rest)]
            length = min(enough) if enough else max(fits)
            chunk = rest[:length]
            if not self.all_rows and (
                len(chunk) < length
                or (not self.prefill_returns_logits and len(chunk) == len(rest))
            ):
                # The file returns its last row, here a padding row, or no
                # logits: the prompt's last id goes through decode instead.
                chunk = chunk[:-1]
            logits = self._run(
                self.prefill_lengths[length],
                chunk + [0] * (length - len(chunk)),
                self.position,
            )
            if logits is not None:
                rows.extend(logits[: len(chunk)] if self.all_rows else logits[-1:])
            self.position += len(chunk)
            fed += len(chunk)
        return np.stack(rows if self.all_rows else rows[-1:])

    def decode(self, token) -> np.ndarray:
        """Append `token`; its logits `(vocab,)`."""
        self._check_room(1)
        logits = self._run("decode", [int(token)], self.position)[0]
        self.position += 1
        return logits

    def generate(
        self,
        ids,
        max_new_tokens: int,
        *,
        top_k: int | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        stop_tokens=(),
    ) -> list[int]:
        """The `max_new_tokens` ids after the prompt `ids` (fewer if a stop
        token comes): greedy, or sampled from the `top_k` most likely at
        `temperature`."""
        rng = np.random.default_rng(seed)
        logits = self.prefill(ids)[-1]
        out = []
        for step in range(max_new_tokens):
            token = _choose(logits, top_k, temperature, rng)
            out.append(token)
            if token in stop_tokens or step == max_new_tokens - 1:
                break
            logits = self.decode(token)
        return out


def _choose(logits, top_k, temperature, rng):
    if top_k is None:
        return int(np.argmax(logits))
    top = np.argsort(logits)[-top_k:]
    scaled = logits[top].astype(np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    return int(rng.choice(top, p=weights / weights.sum()))
