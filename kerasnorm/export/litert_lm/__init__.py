"""Generative export of decoder LMs: prefill and decode over per-layer
key/value caches, in the file layout LiteRT-LM's engine reads
(`to_litert_lm`; the design notes explain the cache layout)."""
