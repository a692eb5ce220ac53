"""Every export option combined with every other (`ExportOptions`).

The matrix: {`to_saved_model`, `to_tflite`} x every quantize mode (the
SavedModel has none) x {whole sequence, streaming} x {float32,
`mixed_float16`, `mixed_bfloat16`} x {Functional with named inputs,
Functional with unnamed inputs, Sequential, two inputs, dict inputs, token
ids into an `Embedding(mask_zero=True)`} x {`verify_inputs` given, not
given} x {fixed shape (`batch_size=1`), undefined batch (the default),
undefined length (`keras.Input((None, features))`)}: 6 x 2 x 3 x 6 x 2 x 3
= 1296 cells.

Each cell either exports and verifies, or is refused with the error
`expected_refusal` names. What a successful export must show:

- the artifact is where `result.path` says, and its check passed;
- the given `verify_inputs` reached the fold's self-check
  (`fold_report.check_shapes`) and the parity check (`verification.samples`);
- a half-precision model is exported from a rebuild (`rebuilt_from`) and the
  artifact is checked against the original too (`original_verification`);
- both artifacts name their signature the same way (`expected_names`): a
  named Input by its name, a dict model's inputs by their keys, an Input
  with a name Keras made up (`input_layer_3`, `keras_tensor_7`) as
  `input_<i>`; outputs by their output layer's name. A streaming step keeps
  its frame input and `state_<layer>_<i>` states;
- fed by those names, the artifact computes what the Keras model computes
  (an independent check of the name-to-input mapping, float modes);
- the artifact's input shapes are the shape rule's (`expected_shapes`: what
  the model leaves undefined stays dynamic; a recurrent model's `.tflite`
  keeps batch 1; `batch_size` fixes the batch), and a dynamic artifact was
  checked at two shapes (`verification.shapes`).

Cost: the models are tiny (a few units, 4 time steps) and built once per
process; each cell exports once and checks that artifact. `FAST`, the
default tier, is a pairwise cover of the matrix (every value of every
option with every value of every other option, in at least one cell; at
least 36 cells, as the 6 targets meet the 6 model families); `SLOW`, marked
`threewise` (and `slow`, `exhaustive`: out of CI), completes it to a
three-wise cover (every triple of values; at least 108 cells, 6 targets x
6 families x 3 shapes), run with `-m threewise`. Both are chosen greedily
and deterministically by `covering`. The other cells are marked
`exhaustive`: the whole product runs with `-m exhaustive`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasnorm import layers as kl
from kerasnorm.export import QUANTIZE_MODES
from kerasnorm.export import ExportConversionError
from kerasnorm.export import litert
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export.litert.runner import interpreter as litert_interpreter
from kerasnorm.export.naming.names import FRAME
from kerasnorm.export.naming.names import STATE_PREFIX
from kerasnorm.export.options.modes import MODES

# SavedModel and TFLite: TensorFlow programs.
pytestmark = pytest.mark.tf_only

L = keras.layers
STEPS = 4  # time steps of every sequence input
UNITS = 6
N_VERIFY = 5  # the user's verify_inputs: a batch no default uses
N_CALIBRATION = 24  # representative_data of the full-integer modes
VOCAB = 20  # the token family's Embedding
# The modes that calibrate on representative_data, from the one mode table.
FULL_INTEGER = tuple(q for q, mode in MODES.items() if mode.calibrates)

# --- the options --------------------------------------------------------------

TARGETS = [("saved_model", None)] + [("tflite", q) for q in QUANTIZE_MODES]
STREAMING = [False, True]
POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]
FAMILIES = ["named", "unnamed", "sequential", "two_inputs", "dict", "tokens"]
VERIFY = [False, True]
# The dynamic-shape axis: "fixed" passes batch_size=1; "batch" leaves the
# batch undefined (the default); "length" builds the model with an
# undefined sequence length as well.
SHAPES = ["fixed", "batch", "length"]
MULTI_INPUT = ("two_inputs", "dict")


@dataclasses.dataclass(frozen=True)
class Cell:
    writer: str  # "saved_model" or "tflite"
    quantize: str | None
    streaming: bool
    policy: str
    family: str
    verify: bool
    shape: str = "batch"

    @property
    def id(self):
        return "-".join(
            [
                self.writer,
                str(self.quantize).lower(),
                "stream" if self.streaming else "whole",
                self.policy,
                self.family,
                "verify" if self.verify else "default",
                self.shape,
            ]
        )

    def factors(self):
        """The cell's value of each option, `TARGETS` as one option."""
        return (
            (self.writer, self.quantize),
            self.streaming,
            self.policy,
            self.family,
            self.verify,
            self.shape,
        )


ALL_CELLS = [
    Cell(*target, streaming, policy, family, verify, shape)
    for target, streaming, policy, family, verify, shape in itertools.product(
        TARGETS, STREAMING, POLICIES, FAMILIES, VERIFY, SHAPES
    )
]


def expected_refusal(cell):
    """`(error class, match)` for a cell a user should be refused, else None.

    Streaming splits one sequence input into time steps: a model with two
    inputs, or a dict of inputs, is refused by name before any work (its
    inputs need not even share a time axis). The 16x8 quantizer takes no
    Keras mask (`SELECT_V2`, `NOT_EQUAL`): the token model's
    `Embedding(mask_zero=True)` is refused by name at int16x8, before
    conversion. A full-integer whole-sequence file unrolls the SimpleRNN,
    which needs its length: an undefined one is refused, naming the fix.
    Every other cell exports.
    """
    if cell.streaming and cell.family in MULTI_INPUT:
        return ValueError, r"streaming=True needs .*one sequence input"
    full_integer = cell.writer == "tflite" and cell.quantize in FULL_INTEGER
    if full_integer and cell.shape == "length" and not cell.streaming:
        return ValueError, r"undefined time dimension.*input_signature=\{"
    if cell.family == "tokens" and cell.quantize == "int16x8":
        return ExportConversionError, r"'embed' \(Embedding, mask_zero=True\)"
    return None


def covering(cells, strength):
    """A subset of `cells` in which every combination of `strength` option
    values that occurs in `cells` occurs at least once (strength 2: every
    pair): greedily, the cell covering the most combinations not yet
    covered; among those, the one whose values were chosen least so far (so
    that each option's values share the cells evenly), then the first in
    `cells` order (deterministic)."""

    def combinations(cell):
        values = list(enumerate(cell.factors()))
        return set(itertools.combinations(values, strength))

    uncovered = set().union(*(combinations(c) for c in cells))
    used = collections.Counter()
    chosen = []
    while uncovered:
        best = max(
            cells,
            key=lambda c: (
                len(combinations(c) & uncovered),
                -sum(used[v] for v in enumerate(c.factors())),
            ),
        )
        chosen.append(best)
        uncovered -= combinations(best)
        used.update(enumerate(best.factors()))
    return chosen


# The default tier (CI): every pair of option values. `-m threewise`
# completes it to every triple (104 more exports, about 2 minutes of CI's
# two processes, out of CI since CI's time budget; docs/contributing.md).
# The rest of the product runs with `-m exhaustive`.
FAST = set(covering(ALL_CELLS, 2))
SLOW = set(covering(ALL_CELLS, 3)) - FAST


def _marks(cell):
    if cell in FAST:
        return ()
    if cell in SLOW:
        return (pytest.mark.slow, pytest.mark.exhaustive, pytest.mark.threewise)
    return (pytest.mark.slow, pytest.mark.exhaustive)


def _params():
    return [pytest.param(c, id=c.id, marks=_marks(c)) for c in ALL_CELLS]


# --- the models ---------------------------------------------------------------


def _trunk(x):
    """Dense + BatchNorm (folded) -> SimpleRNN -> LayerNorm: one of each
    kind of layer the pipeline treats specially."""
    x = L.Dense(UNITS)(x)
    x = L.BatchNormalization()(x)
    x = L.SimpleRNN(UNITS, return_sequences=True)(x)
    return kl.LayerNorm()(x)


def _build(family, steps=STEPS):
    """The model of `family`, written the way Keras' guides write it, over
    `steps` time steps (None: any length)."""
    if family == "named":
        x = keras.Input((steps, 3), name="frames")
        return keras.Model(x, L.Dense(2, name="score")(_trunk(x)))
    if family == "unnamed":
        x = keras.Input((steps, 3))
        return keras.Model(x, L.Dense(2)(_trunk(x)))
    if family == "tokens":
        # A keyboard's or a decoder's ids, 0 the padding: its mask reaches
        # the recurrent layer through Dense and BatchNorm.
        ids = keras.Input((steps,), dtype="int32", name="tokens")
        x = L.Embedding(VOCAB, 3, mask_zero=True, name="embed")(ids)
        return keras.Model(ids, L.Dense(2, name="score")(_trunk(x)))
    if family == "sequential":
        return keras.Sequential(
            [
                keras.Input((steps, 3)),
                L.Dense(UNITS),
                L.BatchNormalization(),
                L.SimpleRNN(UNITS, return_sequences=True),
                kl.LayerNorm(),
                L.Dense(2),
            ]
        )
    left = keras.Input((steps, 3), name="left" if family == "two_inputs" else "age")
    right = keras.Input((steps, 2), name="right" if family == "two_inputs" else "city")
    y = L.Dense(2, name="score")(_trunk(L.Concatenate()([left, right])))
    if family == "two_inputs":
        return keras.Model([left, right], y)
    # Keras' structured-data guides: Inputs named as their keys.
    return keras.Model({"age": left, "city": right}, y)


@functools.cache
def model_of(family, policy, steps=STEPS):
    """The model, built under `policy` with its BatchNorm statistics set,
    once per process (every cell of it shares it; exporting never changes
    it)."""
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(FAMILIES.index(family))
        model = _build(family, steps)
    finally:
        keras.config.set_dtype_policy(saved)
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, UNITS),
                    rng.normal(0, 0.3, UNITS),
                    rng.normal(0, 0.3, UNITS),
                    rng.uniform(0.5, 2.0, UNITS),
                ]
            )
    return model


def inputs_of(model, n, seed):
    """`n` samples in the model's own input structure (an array, a list, a
    dict by key), float32 standard normal; token ids in [0, VOCAB), 0 (the
    padding) at one in four."""
    rng = np.random.default_rng(seed)

    def sample(x):
        shape = [STEPS if d is None else d for d in x.shape[1:]]
        if x.dtype == "int32":
            ids = rng.integers(1, VOCAB, (n, *shape)).astype("int32")
            return np.where(rng.random((n, *shape)) < 0.25, 0, ids).astype("int32")
        return rng.standard_normal((n, *shape)).astype("float32")

    structure = model.input if not isinstance(model, keras.Sequential) else None
    if structure is None or not keras.tree.is_nested(structure):
        return sample(model.inputs[0])
    return keras.tree.map_structure(sample, structure)


# --- the signature names --------------------------------------------------------

# Names Keras gives an Input the user did not name: they change from one run
# of a script to the next, so an artifact cannot be served by them.
KERAS_MADE_NAME = re.compile(r"^(input_layer|keras_tensor)(_\d+)?$")


def expected_names(model):
    """`(inputs, outputs)` of the whole-model signature, both sorted."""
    structure = model.input if not isinstance(model, keras.Sequential) else None
    if isinstance(structure, dict):
        inputs = list(structure)
    else:
        inputs = [
            f"input_{i}" if KERAS_MADE_NAME.match(x.name) else x.name
            for i, x in enumerate(model.inputs)
        ]
    outputs = [model.layers[-1].name]  # every model here: its last layer
    return sorted(inputs), sorted(outputs)


def tflite_names(path):
    with open(path, "rb") as f:
        signature = litert_interpreter(f.read()).get_signature_list()
    names = signature[litert.SIGNATURE_KEY]
    return sorted(names["inputs"]), sorted(names["outputs"])


def saved_model_function(path):
    return tf.saved_model.load(path).signatures["serving_default"]


def saved_model_names(function):
    inputs = function.structured_input_signature[1]
    return sorted(inputs), sorted(function.structured_outputs)


def _check_streaming_names(model, got):
    """A step's names: one frame input (`x`, or the model's input name),
    the `state_<layer>_<i>` states in and out, one output per model output
    (`output_<i>`, or the output layer's name)."""
    inputs, outputs = got
    states = sorted(
        f"{STATE_PREFIX}{layer.name}_0"
        for layer in model.layers
        if isinstance(layer, L.RNN)
    )
    whole_inputs, whole_outputs = expected_names(model)
    assert [n for n in inputs if n not in states] in ([FRAME], whole_inputs)
    assert sorted(n for n in inputs if n in states) == states
    assert sorted(n for n in outputs if n in states) == states
    assert [n for n in outputs if n not in states] in (["output_0"], whole_outputs)


# --- feeding the artifact by name ----------------------------------------------

# max |artifact - keras| / max |keras| of the independent by-name check, per
# quantize mode, plus the original's compute error per policy.
BY_NAME_TOLERANCE = {None: 1e-4, "float16": 1e-2}
POLICY_TOLERANCE = {"float32": 0.0, "mixed_float16": 1e-2, "mixed_bfloat16": 6e-2}


def _by_name(model, x):
    """`x` (the model's own structure) as `{signature name: array}`."""
    names = expected_names(model)[0]
    if isinstance(x, dict):
        return dict(x)
    arrays = x if isinstance(x, list) else [x]
    structure = model.inputs
    order = [
        f"input_{i}" if KERAS_MADE_NAME.match(t.name) else t.name
        for i, t in enumerate(structure)
    ]
    assert sorted(order) == names
    return dict(zip(order, arrays, strict=True))


def _run_by_name(result, feed, function):
    """The artifact fed by name, one sample per call (a batch the artifact
    takes whether its batch is fixed at 1 or dynamic)."""
    if result.kind == "saved_model":

        def runner(**row):
            return function(**{k: tf.constant(v) for k, v in row.items()})

    else:
        with open(result.path, "rb") as f:
            content = f.read()
        runner = litert_interpreter(content).get_signature_runner(litert.SIGNATURE_KEY)
    n = len(next(iter(feed.values())))
    rows = [runner(**{k: v[i : i + 1] for k, v in feed.items()}) for i in range(n)]
    return [np.concatenate([np.asarray(r[k]) for r in rows]) for k in sorted(rows[0])]


def _check_by_name(cell, model, result, function):
    x = inputs_of(model, 3, seed=7)
    got = _run_by_name(result, _by_name(model, x), function)
    want = [np.asarray(y, "float32") for y in keras.tree.flatten(model(x))]
    tolerance = BY_NAME_TOLERANCE[cell.quantize] + POLICY_TOLERANCE[cell.policy]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        error = np.max(np.abs(a - b)) / np.max(np.abs(b))
        assert error <= tolerance, (error, tolerance)


# --- the matrix ----------------------------------------------------------------


def export(cell, model, tmp_path, verify_inputs):
    kwargs = {"streaming": cell.streaming}
    if cell.shape == "fixed":
        kwargs["batch_size"] = 1
    if verify_inputs is not None:
        kwargs["verify_inputs"] = verify_inputs
    if cell.writer == "saved_model":
        return to_saved_model(model, tmp_path / "served", **kwargs)
    if cell.quantize in FULL_INTEGER:
        kwargs["representative_data"] = inputs_of(model, N_CALIBRATION, seed=3)
    return to_tflite(model, tmp_path / "model.tflite", quantize=cell.quantize, **kwargs)


def _shapes(x):
    return [tuple(np.shape(a)) for a in keras.tree.flatten(x)]


@pytest.mark.parametrize("cell", _params())
def test_export_cell(cell, tmp_path):
    model = model_of(
        cell.family, cell.policy, None if cell.shape == "length" else STEPS
    )
    verify_inputs = inputs_of(model, N_VERIFY, seed=5) if cell.verify else None

    refusal = expected_refusal(cell)
    if refusal is not None:
        error, match = refusal
        with pytest.raises(error, match=match):
            export(cell, model, tmp_path, verify_inputs)
        assert os.listdir(tmp_path) == []  # refused before any file
        return

    result = export(cell, model, tmp_path, verify_inputs)
    # Every property is checked and every failure reported: a cell that
    # fails one shows whether it fails the others too.
    failed = []
    for check in (_artifact, _check_inputs, _rebuild, _names, _dynamic):
        try:
            check(cell, model, result, verify_inputs)
        except AssertionError as err:
            failed.append(f"{check.__name__}: {err}")
    assert not failed, "\n".join(failed)


def _artifact(cell, model, result, verify_inputs):
    """The artifact is where the result says, and its check passed."""
    assert os.path.exists(result.path)
    if cell.writer == "saved_model":
        assert os.path.isfile(os.path.join(result.path, "saved_model.pb"))
    assert result.kind == cell.writer
    assert result.quantize == cell.quantize
    assert result.verification is not None


def _check_inputs(cell, model, result, verify_inputs):
    """The user's inputs reach the fold's self-check and the parity check."""
    report = result.fold_report
    assert report is not None and report.check_shapes
    if cell.verify:
        assert sorted(report.check_shapes) == sorted(_shapes(verify_inputs))
        assert result.verification.samples == N_VERIFY


def _rebuild(cell, model, result, verify_inputs):
    """A half-precision model: exported from a rebuild, checked against the
    original too (on the user's inputs)."""
    if cell.policy == "float32":
        assert result.rebuilt_from is None
        assert result.original_verification is None
    else:
        assert result.rebuilt_from == cell.policy
    if result.rebuilt_from is not None:
        assert result.original_verification is not None
        if cell.verify:
            assert result.original_verification.samples == N_VERIFY


def _names(cell, model, result, verify_inputs):
    """The signature's names; fed by them, the artifact computes the model
    (float modes of a whole-model export)."""
    function = None  # the SavedModel, loaded once for both checks
    if cell.writer == "saved_model":
        function = saved_model_function(result.path)
        got = saved_model_names(function)
    else:
        got = tflite_names(result.path)
    if cell.streaming:
        _check_streaming_names(model, got)
        return
    assert got == expected_names(model)
    if cell.quantize in BY_NAME_TOLERANCE:
        _check_by_name(cell, model, result, function)


def expected_shapes(cell, model):
    """{signature input name: shape} of the artifact, None where dynamic:
    the batch fixed by `batch_size=1`, and at 1 in a whole-sequence
    `.tflite` file of these recurrent models (the converter lowers a loop
    only for a known batch) and in every int8 / int16x8 file; the length
    as the model leaves it; a streaming step's frame `(batch, features)`
    (token ids: `(batch,)`)."""
    tflite = cell.writer == "tflite"
    fixed_batch = cell.shape == "fixed" or (
        tflite and (not cell.streaming or cell.quantize in FULL_INTEGER)
    )
    batch = 1 if fixed_batch else None
    length = None if cell.shape == "length" else STEPS
    if cell.streaming:
        return {FRAME: (batch, *model.inputs[0].shape[2:])}
    sample = _by_name(model, inputs_of(model, 1, seed=0))
    return {name: (batch, length, *x.shape[2:]) for name, x in sample.items()}


def _artifact_shapes(result, names):
    if result.kind == "saved_model":
        specs = saved_model_function(result.path).structured_input_signature[1]
        return {n: tuple(specs[n].shape.as_list()) for n in names}
    with open(result.path, "rb") as f:
        shapes = litert.Runner(f.read()).input_shapes
    return {n: shapes[n] for n in names}


def _dynamic(cell, model, result, verify_inputs):
    """The artifact's shapes are the rule's; a dynamic one was checked at
    two shapes, each dynamic dimension at another size the second time."""
    expected = expected_shapes(cell, model)
    assert _artifact_shapes(result, list(expected)) == expected
    dynamic = any(None in shape for shape in expected.values())
    calls = result.verification.shapes
    assert len(calls) == (2 if dynamic else 1), calls
    if dynamic:
        first, second = calls[0][0], calls[1][0]
        some = next(iter(expected.values()))
        axes = [a for a, d in enumerate(some) if d is None and a < len(first)]
        assert all(first[a] != second[a] for a in axes), calls


@pytest.mark.parametrize("strength", [2, 3])
def test_the_covers_cover_every_combination(strength):
    """The default tier holds every value of each option with every value of
    each other option; the default and slow tiers together every triple (the
    covers' own check, independent of their greedy loop)."""
    tiers = {2: FAST, 3: FAST | SLOW}[strength]
    chosen = [c for c in ALL_CELLS if c in tiers]
    options = list(zip(*(c.factors() for c in ALL_CELLS), strict=True))
    for axes in itertools.combinations(range(len(options)), strength):
        wanted = set(itertools.product(*(set(options[a]) for a in axes)))
        seen = {tuple(c.factors()[a] for a in axes) for c in chosen}
        assert wanted <= seen, (axes, wanted - seen)
    assert len(tiers) < len(ALL_CELLS) / 8


def test_both_artifacts_of_one_model_share_names(tmp_path):
    """The SavedModel and the `.tflite` of one dict model: the same names
    (`age, city -> score` for both)."""
    model = model_of("dict", "float32")
    saved = to_saved_model(model, tmp_path / "served")
    lite = to_tflite(model, tmp_path / "model.tflite")
    assert saved_model_names(saved_model_function(saved.path)) == tflite_names(
        lite.path
    )
    assert tflite_names(lite.path) == (["age", "city"], ["score"])
