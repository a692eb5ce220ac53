"""`kerasnorm export` and `kerasnorm qat` load the user's own layers:
`--import` (a module name or a `.py` path, repeatable) and
`--no-safe-mode` (Lambda layers), issue 34 item 3."""

import importlib.util
import os
import sys
import textwrap

import keras
import numpy as np
import pytest

from kerasnorm.export import litert
from kerasnorm_cli import command as main
from kerasnorm_cli.checks import parse
from kerasnorm_cli.exits import EXIT_OK
from kerasnorm_cli.exits import EXIT_USAGE

pytestmark = pytest.mark.tf_only

# A ViT's patch layers as keras.io writes them, and a diffusion model's
# time embedding as a registered function in a Lambda.
_LAYERS = """
import keras
from keras import ops

PACKAGE = "kn_user_layers"


@keras.saving.register_keras_serializable(package=PACKAGE)
class Patches(keras.layers.Layer):
    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, images):
        p = self.patch_size
        n = images.shape[1] // p
        x = ops.reshape(images, (-1, n, p, n, p, images.shape[-1]))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, n * n, p * p * images.shape[-1]))

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchEncoder(keras.layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches = num_patches
        self.projection_dim = projection_dim
        self.projection = keras.layers.Dense(projection_dim)
        self.position_embedding = keras.layers.Embedding(num_patches, projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(0, self.num_patches), 0)
        return self.projection(patch) + self.position_embedding(positions)

    def get_config(self):
        return {
            **super().get_config(),
            "num_patches": self.num_patches,
            "projection_dim": self.projection_dim,
        }


@keras.saving.register_keras_serializable(package=PACKAGE)
def time_embedding(t):
    return ops.concatenate([ops.sin(3.0 * t), ops.cos(3.0 * t)], axis=-1)
"""


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """`layers.py`, and `vit.keras` / `lambda.keras` saved with its layers;
    then the registrations are dropped, as in a fresh `kerasnorm` process."""
    source = tmp_path / "layers.py"
    source.write_text(textwrap.dedent(_LAYERS))
    spec = importlib.util.spec_from_file_location("kn_user_layers_src", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1), name="image")
    x = module.PatchEncoder(4, 8)(module.Patches(4)(inputs))
    x = keras.layers.Flatten()(keras.layers.LayerNormalization()(x))
    vit = keras.Model(inputs, keras.layers.Dense(3, name="logits")(x))
    vit.save(tmp_path / "vit.keras")
    # The registered function loads by name; the scaling lambda around it
    # is stored as Python bytecode, which only safe_mode=False runs.
    t = keras.Input((1,), name="t")
    scaled = keras.layers.Lambda(lambda t: t * 0.001, name="scale")(t)
    embedded = keras.layers.Lambda(module.time_embedding, name="embed")(scaled)
    unet = keras.Model(t, keras.layers.Dense(2, name="noise")(embedded))
    unet.save(tmp_path / "lambda.keras")
    objects = keras.saving.get_custom_objects()
    for key in [k for k in objects if k.startswith("kn_user_layers>")]:
        monkeypatch.delitem(objects, key)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "layers", raising=False)
    return tmp_path, vit, unet


def _tflite_matches(path, model, x):
    runner = litert.Runner(open(path, "rb").read())
    got = runner.named({litert.signature_names(model)[0][0]: x})
    want = np.asarray(model(x))
    (out,) = got.values()
    assert np.max(np.abs(out - want)) <= 1e-4 * np.max(np.abs(want))


def test_the_users_layers_load_with_import(user_files, capsys):
    root, vit, _ = user_files
    model, out = str(root / "vit.keras"), str(root / "out")
    assert main(["export", model, "--out", out, "--tflite"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Could not locate class 'Patches'" in err
    assert "pass --import MODULE (a module name or a .py file)" in err
    assert not os.path.exists(out)
    argv = ["export", model, "--out", out, "--tflite", "--saved-model"]
    code = main([*argv, "--import", str(root / "layers.py")])
    text = capsys.readouterr().out
    assert code == EXIT_OK, text
    assert sorted(os.listdir(out)) == ["vit", "vit.tflite"]
    x = np.random.default_rng(0).random((1, 8, 8, 1), "float32")
    _tflite_matches(os.path.join(out, "vit.tflite"), vit, x)


def test_import_by_module_name_and_repeated(user_files, capsys, monkeypatch):
    root, _, _ = user_files
    monkeypatch.syspath_prepend(str(root))
    (root / "helpers.py").write_text("VALUE = 1\n")
    out = str(root / "out")
    argv = ["export", str(root / "vit.keras"), "--out", out, "--tflite"]
    code = main([*argv, "--import", "helpers", "--import", "layers"])
    assert code == EXIT_OK, capsys.readouterr()
    assert "helpers" in sys.modules and "layers" in sys.modules


def test_a_lambda_model_loads_with_no_safe_mode(user_files, capsys):
    root, _, unet = user_files
    model, out = str(root / "lambda.keras"), str(root / "out")
    layers = str(root / "layers.py")
    argv = ["export", model, "--out", out, "--tflite", "--import", layers]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "safe_mode" in err and "Pass --no-safe-mode if you trust the file" in err
    assert main([*argv, "--no-safe-mode"]) == EXIT_OK
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "--no-safe-mode" in line]
    assert warning == [
        f"kerasnorm export: warning: --no-safe-mode: loading {model} runs the "
        "Python code stored in it (its Lambda layers); use it only on files you "
        "trust."
    ]
    t = np.full((1, 1), 0.7, "float32")
    _tflite_matches(os.path.join(out, "lambda.tflite"), unet, t)


def test_qat_loads_the_users_layers(user_files, capsys):
    root, _, _ = user_files
    data = root / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((16, 8, 8, 1), "float32"), y=rng.integers(0, 3, 16))
    argv = ["qat", str(root / "vit.keras"), "--data", str(data), "--epochs", "1"]
    argv += ["--out", str(root / "out")]
    assert main(argv) == EXIT_USAGE
    assert "Could not locate class 'Patches'" in capsys.readouterr().err
    main([*argv, "--import", str(root / "layers.py")])
    # Loaded: whatever TFMOT makes of the custom layers, not a load failure.
    assert "could not be loaded" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "qat"])
def test_help_lists_the_flags(command, capsys):
    assert parse([command, "--help"]) == (None, 0)
    text = " ".join(capsys.readouterr().out.split())
    assert "--import MODULE" in text and "a .py file path" in text
    assert "--no-safe-mode" in text and "safe_mode=False" in text


@pytest.mark.parametrize(
    "value, message",
    [
        ("missing.py", "--import 'missing.py': no such .py file"),
        ("1bad-name", "--import '1bad-name' is neither a module name"),
    ],
)
def test_bad_import_values_are_refused_before_loading(tmp_path, capsys, value, message):
    model = tmp_path / "m.keras"
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(model)
    argv = ["export", str(model), "--out", str(tmp_path / "out"), "--import", value]
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")


def test_a_module_that_fails_to_import_is_named(tmp_path, capsys):
    model = tmp_path / "m.keras"
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(model)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    argv = ["export", str(model), "--out", str(tmp_path / "out"), "--import"]
    assert main([*argv, str(broken)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--import {broken} failed (RuntimeError: no GPU here)" in err
