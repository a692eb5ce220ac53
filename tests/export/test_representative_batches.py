"""`representative_data` (and every data argument) as batches, in the forms
`tf.lite.TFLiteConverter.representative_dataset` yields them: a list or an
iterator of batches, each a dict by input name, a list in `model.inputs`
order or one array; a callable returning such an iterator."""

import keras
import numpy as np
import pytest

from kerasnorm.export import model_inputs
from kerasnorm.export import to_tflite
from tests.support.helpers import random_inputs

L = keras.layers


def _two_inputs():
    age = keras.Input((3,), name="age")
    city = keras.Input((2,), name="city")
    return keras.Model([age, city], L.Dense(1)(L.Concatenate()([age, city])))


def _batches(sizes=(2, 3, 1)):
    return [
        (random_inputs((n, 3), seed=i), random_inputs((n, 2), seed=10 + i))
        for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize(
    "form", ["dicts", "lists", "tuples", "generator", "callable", "iterator"]
)
def test_batches_of_a_two_input_model_are_concatenated(form):
    model = _two_inputs()
    batches = _batches()
    dicts = [{"age": a, "city": c} for a, c in batches]
    data = {
        "dicts": dicts,
        "lists": [[a, c] for a, c in batches],
        "tuples": [(a, c) for a, c in batches],
        "generator": (d for d in dicts),
        "callable": lambda: iter(dicts),
        "iterator": iter([[a, c] for a, c in batches]),
    }[form]
    got = model_inputs(model, data, argument="representative_data")
    expected = [np.concatenate(parts) for parts in zip(*batches, strict=True)]
    assert [x.shape for x in got] == [(6, 3), (6, 2)]
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("form", ["arrays", "wrapped", "generator"])
def test_batches_of_a_one_input_model(form):
    # TF's representative_dataset yields `[array]` per batch.
    model = keras.Sequential([keras.Input((3,)), L.Dense(1)])
    arrays = [a for a, _ in _batches()]
    data = {
        "arrays": arrays,
        "wrapped": [[a] for a in arrays],
        "generator": (a for a in arrays),
    }[form]
    got = model_inputs(model, data)
    np.testing.assert_array_equal(got, np.concatenate(arrays))


def test_refused_batches_name_the_form_expected():
    model = _two_inputs()
    a, c = _batches()[0]
    with pytest.raises(
        ValueError,
        match=(
            r"representative_data: batch 1 has 1 input array\(s\) but the model "
            r"has 2 input\(s\) \(age, city\); each batch should be a dict keyed "
            r"by \['age', 'city'\], a list in that order, batch first"
        ),
    ):
        model_inputs(model, [[a, c], [a]], argument="representative_data")
    with pytest.raises(
        ValueError,
        match=r"holds a batch 0 of type int; each batch should be a dict keyed",
    ):
        model_inputs(model, iter([3, 4]), argument="representative_data")
    with pytest.raises(ValueError, match=r"missing model input\(s\) \['city'\]"):
        model_inputs(model, [{"age": a}], argument="representative_data")
    with pytest.raises(ValueError, match="representative_data is empty"):
        model_inputs(model, iter([]), argument="representative_data")
    with pytest.raises(ValueError, match=r"for input 'city' should have shape"):
        model_inputs(model, [[a, a]], argument="representative_data")
    # A plain list of arrays stays a list of inputs: one per model input.
    with pytest.raises(ValueError, match=r"has 3 input array\(s\)"):
        model_inputs(model, [a, c, c], argument="representative_data")


@pytest.mark.tf_only
def test_int8_export_calibrates_on_a_list_of_dict_batches(tmp_path):
    # The form a user of TF's converter has at hand: one dict per batch.
    keras.utils.set_random_seed(0)
    tokens = keras.Input((8,), dtype="int32", name="tokens")
    mask = keras.Input((8,), name="mask")
    x = L.Embedding(20, 8)(tokens) * keras.ops.expand_dims(mask, -1)
    model = keras.Model([tokens, mask], L.Dense(2)(L.GlobalAveragePooling1D()(x)))
    rng = np.random.default_rng(0)
    batches = [
        {
            "tokens": rng.integers(0, 20, (4, 8)).astype("int32"),
            "mask": np.ones((4, 8), "float32"),
        }
        for _ in range(8)
    ]
    result = to_tflite(
        model, tmp_path / "m.tflite", quantize="int8", representative_data=batches
    )
    assert result.verification.checked_on == "representative_data"
    assert result.verification.samples == 32
