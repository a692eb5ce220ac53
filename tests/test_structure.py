"""The private-API wall: other libraries' private names only in `_compat/`.

`kerasnorm/_compat/` holds every underscore attribute of another library
and every method of another library's object that kerasnorm replaces, each
with its reason and the version checked (docs/design.md). This scans the
package's source for such uses elsewhere:

- an attribute with a single leading underscore (`x._name`, also through
  `getattr`/`setattr`/`hasattr`/`delattr` with a literal name) that belongs to
  another library: Keras, `tf_keras` or TensorFlow objects have it, or
  kerasnorm defines it nowhere;
- an assignment that replaces a method of an object that is not `self`/`cls`
  (`model.train_step = f`, `object.__setattr__(layer, "call", f)`), where the
  method is one of another library's classes;
- a class overriding one of the undocumented hooks of Keras' classes.

kerasnorm's own private names (`self._framework`, `cls._cell_class`, a
module's `_helper`) are what kerasnorm defines and no other library's object
has, so they pass.
"""

import ast
import importlib.util
import pathlib

import keras
import numpy as np
import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "kerasnorm"
WALL = PACKAGE / "_compat"
# Methods of Keras' classes that Keras does not document but calls, so that
# overriding one is relying on a private protocol.
HOOKS = {"inner_loop"}
_ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "hasattr", "delattr"}


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _subclassed_probes():
    """Objects of the classes kerasnorm's classes subclass (what `self` is)."""
    cell = keras.layers.LSTMCell(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse")
    probes = [keras.layers.Layer(), cell, keras.layers.RNN(cell), model]
    if importlib.util.find_spec("tf_keras") is not None:
        import tf_keras

        tf_cell = tf_keras.layers.LSTMCell(2)
        probes += [tf_keras.layers.Layer(), tf_cell, tf_keras.layers.RNN(tf_cell)]
        probes.append(tf_keras.Sequential([tf_keras.layers.Dense(2)]))
    return probes


def _other_probes():
    """Other objects of those libraries that kerasnorm handles."""
    return [keras.Variable(np.zeros(2)), keras.KerasTensor((2,)), keras.ops.ones(2)]


def _private_names(probes):
    return frozenset(n for probe in probes for n in dir(probe) if _is_private(n))


@pytest.fixture(scope="module")
def foreign():
    """Other libraries' private attribute names, those on the classes
    kerasnorm subclasses apart, and their objects' method names."""
    subclassed = _subclassed_probes()
    own_kind = _private_names(subclassed)
    every = own_kind | _private_names(_other_probes())
    methods = set()
    for probe in subclassed:
        for name in dir(type(probe)):
            attribute = getattr(type(probe), name, None)
            if callable(attribute) and not isinstance(attribute, type):
                methods.add(name)
    return {"self": own_kind, "any": every, "methods": frozenset(methods)}


def _sources():
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def _own_names(sources):
    """The private names kerasnorm defines: functions, classes, class and
    module constants, and attributes it assigns."""
    own = set()
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
    return frozenset(n for n in own if _is_private(n))


def _literal(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _receiver_is_own(node):
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _named_accesses(tree):
    """(line, receiver node, attribute name, whether it is assigned) for each
    `x.name` and each `getattr`-style call with a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            stored = isinstance(node.ctx, ast.Store)
            yield node.lineno, node.value, node.attr, stored
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            function = node.func
            name = _literal(node.args[1])
            if name is None:
                continue
            if isinstance(function, ast.Name) and function.id in _ATTRIBUTE_FUNCTIONS:
                stored = function.id == "setattr"
                yield node.lineno, node.args[0], name, stored
            elif isinstance(function, ast.Attribute) and function.attr in (
                "__setattr__",
                "__delattr__",
            ):
                yield node.lineno, node.args[0], name, True


def private_api_uses(source, own, foreign):
    """What in `source` uses another library's private API, as strings."""
    found = []
    tree = ast.parse(source)
    for line, receiver, name, stored in _named_accesses(tree):
        what = f"{ast.unparse(receiver)}.{name}"
        # `self` is a layer: a name only Variables or tensors have is its own.
        names = foreign["self" if _receiver_is_own(receiver) else "any"]
        methods = foreign["methods"]
        if _is_private(name) and (name in names or name not in own):
            found.append(f"line {line}: {what} (another library's private name)")
        elif stored and name in methods and not _receiver_is_own(receiver):
            found.append(f"line {line}: {what} replaced on another object")
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in HOOKS:
                found.append(
                    f"line {item.lineno}: {node.name}.{item.name} overrides "
                    "an undocumented Keras hook"
                )
    return found


def test_private_apis_of_other_libraries_are_used_only_in_compat(foreign):
    sources = _sources()
    own = _own_names(sources)
    found = []
    for path, source in sources.items():
        if WALL not in path.parents:
            rel = path.relative_to(PACKAGE.parent)
            found += [f"{rel}: {use}" for use in private_api_uses(source, own, foreign)]
    assert not found, "\n".join(found)


def test_the_wall_itself_is_seen_by_the_scan(foreign):
    """`_compat/` is where the scan finds each kind of use: the scan sees
    what it is meant to forbid elsewhere, on the real code."""
    sources = _sources()
    own = _own_names(sources)
    wall = [source for path, source in sources.items() if WALL in path.parents]
    found = "\n".join(use for s in wall for use in private_api_uses(s, own, foreign))
    for use in ("x._keras_mask", "model._loss_tracker", "layer._autocast"):
        assert use in found, found
    assert "KerasRNNInnerLoop.inner_loop overrides" in found


PLANTED = """
class Loop(keras.layers.RNN):
    def inner_loop(self, sequences, initial_state, mask, training=False):
        return self._own_loop(sequences)

    def _own_loop(self, sequences):
        self._framework = keras
        return cls._cell_class, self._framework, _helper(sequences)


def _helper(x):
    return x


def patch(model, layer, x, y):
    mask = x._keras_mask
    also = getattr(y, "_keras_mask", None)
    layer._tracker.unlock()
    model.train_step = patch
    object.__setattr__(layer, "call", patch)
    setattr(model, "make_train_function", patch)
    model.trainable = False
    return mask, also
"""


def test_the_scan_catches_planted_uses_and_passes_own_names(foreign):
    own = _own_names(_sources()) | {"_own_loop", "_helper"}
    found = private_api_uses(PLANTED, own, foreign)
    expected = [
        "Loop.inner_loop overrides an undocumented Keras hook",
        "x._keras_mask (another library's private name)",
        "y._keras_mask (another library's private name)",
        "layer._tracker (another library's private name)",
        "model.train_step replaced on another object",
        "layer.call replaced on another object",
        "model.make_train_function replaced on another object",
    ]
    for use in expected:
        assert any(use in line for line in found), (use, found)
    # Nothing else: `self._framework`, `cls._cell_class`, `_helper` and the
    # public property `trainable` are not flagged.
    assert len(found) == len(expected), found


MAX_MODULE_LINES = 400


def test_no_module_over_the_line_cap():
    """A module past 400 lines is split by what it does (docs/contributing.md):
    the package, the command's front, and the benchmark packages."""
    roots = [PACKAGE] + [
        PACKAGE.parent / name for name in ("kerasnorm_cli", "benchmarks", "export")
    ]
    assert all(any(root.rglob("*.py")) for root in roots), roots
    lines = {
        str(path.relative_to(PACKAGE.parent)): len(
            path.read_text(encoding="utf-8").splitlines()
        )
        for root in roots
        for path in root.rglob("*.py")
    }
    long = {path: n for path, n in lines.items() if n > MAX_MODULE_LINES}
    assert not long, long


def _contract_modules():
    """Every module an import-linter contract in pyproject.toml names: a
    `layers` contract's layers within its containers, an `independence`
    contract's modules."""
    import tomllib

    with open(PACKAGE.parent / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    named = set()
    for contract in contracts:
        for layer in contract.get("layers", ()):
            for part in layer.split("|"):
                for container in contract.get("containers", [""]):
                    named.add(f"{container}.{part.strip()}".lstrip("."))
        named.update(contract.get("modules", ()))
    return named


def test_every_export_module_is_in_a_folder_contract():
    """Each module of a folder of `kerasnorm.export` with more than one
    module is a layer (or an independent module) of its folder's contract:
    a module added without one is found here, not by a reader."""
    named = _contract_modules()
    export = PACKAGE / "export"
    missing = []
    for folder in sorted(p for p in export.iterdir() if p.is_dir()):
        modules = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        if len(modules) < 2:
            continue
        dotted = f"kerasnorm.export.{folder.name}"
        missing += [f"{dotted}.{m}" for m in modules if f"{dotted}.{m}" not in named]
    assert missing == []
    # And every folder is a layer of the export contract.
    folders = {p.name for p in export.iterdir() if (p / "__init__.py").exists()}
    assert {f for f in folders if f"kerasnorm.export.{f}" not in named} == set()
