"""The quantized paths fuzzed: random sequence models through every
`to_tflite` mode in a worker process (`export/fuzz_export.py`), each file
checked by a raw LiteRT run against Keras. A few graphs here; the script
runs hundreds."""

import pytest

from export import fuzz_export

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]


def test_random_sequence_models_never_crash_or_write_a_wrong_file():
    # 8: one channel of frames into attention; 9: token ids with a padding
    # mask, attention and Keras' LayerNormalization.
    outcomes = fuzz_export.fuzz([8, 9])
    done = [o for o in outcomes if "status" in o]
    assert not [o for o in outcomes if "broken" in o]
    assert len(done) == 2 * len(fuzz_export.MODES)
    statuses = [o["status"] for o in done]
    assert "crashed" not in statuses and "wrong" not in statuses, done
    assert statuses.count("ok") >= len(fuzz_export.MODES)
    for o in done:
        if o["status"] == "refused":
            assert o["reason"].split(":")[0].startswith("Export"), o
        else:
            tolerance = fuzz_export.SLACK * (1e-2 if o["mode"] == "float16" else 0.1)
            assert o["error"] <= tolerance
