"""What the export commands read (`kerasnorm.cli._load`): the model without
its optimizer, and inputs files in the model's own input structure (read by
the library's `model_inputs`, refusals naming the flag)."""

import warnings

import keras
import numpy as np
import pytest

from kerasnorm.cli._load import head
from kerasnorm.cli._load import load_inputs
from kerasnorm.cli._load import load_model
from kerasnorm.export import model_inputs

L = keras.layers


def _two_inputs(structure):
    age = keras.Input((3,), name="age")
    city = keras.Input((2,), name="city", dtype="int32")
    merged = L.Concatenate()([age, L.Embedding(5, 2)(city)[:, 0]])
    inputs = {"age": age, "city": city} if structure == "dict" else [age, city]
    return keras.Model(inputs, L.Dense(1)(merged))


def test_a_dict_model_gets_a_dict_by_key_cast_to_each_input_dtype(tmp_path):
    model = _two_inputs("dict")
    np.savez(
        tmp_path / "d.npz",
        city=np.zeros((6, 2), "int64"),
        age=np.ones((6, 3), "float64"),
    )
    data = load_inputs(str(tmp_path / "d.npz"), model, "--verify-data")
    assert sorted(data) == ["age", "city"]
    assert data["age"].dtype == np.float32 and data["city"].dtype == np.int32
    assert model(data).shape == (6, 1)
    assert head(data, 2)["city"].shape == (2, 2)


def test_a_list_model_gets_a_list_by_name_or_in_order(tmp_path):
    model = _two_inputs("list")
    age, city = np.ones((4, 3), "float32"), np.zeros((4, 2), "int32")
    np.savez(tmp_path / "named.npz", city=city, age=age)
    np.savez(tmp_path / "ordered.npz", age, city)
    for name in ("named.npz", "ordered.npz"):
        data = load_inputs(str(tmp_path / name), model, "--calibration")
        assert isinstance(data, list) and [a.shape for a in data] == [(4, 3), (4, 2)]
    assert [a.shape for a in head(data, 1)] == [(1, 3), (1, 2)]


def test_a_one_input_model_gets_one_array(tmp_path):
    model = keras.Sequential([keras.Input((5,)), L.Dense(2)])
    np.save(tmp_path / "x.npy", np.ones((3, 5), "float64"))
    data = load_inputs(str(tmp_path / "x.npy"), model, "--calibration")
    assert isinstance(data, np.ndarray) and data.dtype == np.float32
    assert head(data, 2).shape == (2, 5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            np.ones((4, 3)),
            r"--flag has 1 input array\(s\) but the model has 2 input\(s\) "
            r"\(age, city\)",
        ),
        (
            {"age": np.ones((4, 3)), "city": np.ones((4, 3))},
            r"--flag for input 'city' should have shape \(N, 2\)",
        ),
        (
            {"age": np.ones((4, 3)), "city": np.ones((5, 2))},
            r"--flag holds different numbers of samples .* \(age: 4, city: 5\)",
        ),
        (
            {"age": np.ones((4, 3)), "town": np.ones((4, 2))},
            r"--flag is missing model input\(s\) \['city'\]",
        ),
        (
            {"age": np.ones((0, 3)), "city": np.ones((0, 2))},
            r"with N >= 1\. Received shape \(0, 3\)",
        ),
    ],
)
def test_inputs_that_do_not_fit_are_refused_naming_the_flag(data, message):
    with pytest.raises(ValueError, match=message):
        model_inputs(_two_inputs("dict"), data, argument="--flag")


def test_the_model_loads_without_its_optimizer(tmp_path):
    """An export never trains: the optimizer's state is not restored, and
    Keras' "Skipping variable loading for optimizer" warning (a model saved
    before its optimizer was built) never shows."""
    model = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    model.compile("adam", "mse")
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keras.saving.load_model(tmp_path / "m.keras")
    assert any("Skipping variable loading" in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_model(str(tmp_path / "m.keras"))
    assert not [w for w in caught if "optimizer" in str(w.message)], caught
    assert not loaded.compiled and getattr(loaded, "optimizer", None) is None
