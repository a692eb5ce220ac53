"""A `.litertlm` bundle's files read back with `litert-lm-builder`'s own
unpacker: what the chat and the embedding bundles' readers share."""

from __future__ import annotations

import os
import tempfile


def unpacked_sections(path):
    """`[(file name, bytes)]` of the bundle at `path`, by name."""
    from litert_lm_builder import litertlm_builder as builder

    with tempfile.TemporaryDirectory(prefix="kerasnorm_litertlm_") as tmp:
        builder.unpack(os.fspath(path), tmp)
        found = []
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                found.append((name, f.read()))
    return found


def parsed_metadata(message, name, data):
    """`message` (an empty metadata proto) filled from a section's `data`,
    written as text (`.pbtext`) or binary, as the file `name` says."""
    from google.protobuf import text_format

    if os.path.splitext(name)[1] == ".pbtext":
        text_format.Parse(data.decode("utf-8"), message)
    else:
        message.ParseFromString(data)
    return message
