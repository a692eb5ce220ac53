import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import pytest

_BACKEND = keras.backend.backend()

if _BACKEND == "jax":
    import jax

    # The float64 references and finite-difference tests need float64 arrays;
    # JAX computes in float32 unless told otherwise.
    jax.config.update("jax_enable_x64", True)


# The slow tests CI runs (marked `ci` below; `.ci/run`'s slow pass is
# `-m "slow and ci and not exhaustive"`): the layers' compiled checks past
# each layer test's first case, the documentation pages, the examples, the
# real checkpoint (SmolLM2-135M-Instruct to an int4 bundle, in LiteRT-LM's
# engine) and training across workers. The rest of the slow tier (the
# language-model and architecture matrices, the engine and chat runs of
# each feature, the benchmarks' smoke runs: 18 minutes of an idle session
# machine's two cores, about twice that on CI's) runs on demand, before a
# change to what it covers lands: `python3 -m pytest -q -n 2 -m "slow and
# not exhaustive"` (docs/contributing.md).
CI_SLOW = (
    "tests/norms/",
    "tests/recurrent/",
    "tests/blocks/",
    "tests/training/test_training_layers.py",
    "tests/test_docs.py",
    "tests/test_examples.py",
    "tests/export/test_real_smollm2.py",
    "tests/training/test_training_distributed.py::test_multi_worker_fit_matches_one_process",
)


# Before pytest-xdist's worker reads the `xdist_group` marks, and before
# `-m` selects by the `ci` marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Skip `tf_only` tests (TFLite, SavedModel, tf.distribute) on the JAX and
    PyTorch backends; everything else runs on all three. Keep the tests
    that share a built model on one worker. Mark the slow tests CI runs
    (`CI_SLOW`) `ci`."""
    for item in items:
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if "slow" in item.keywords and item.nodeid.startswith(CI_SLOW):
            item.add_marker(pytest.mark.ci)
    if _BACKEND == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"needs TensorFlow (KERAS_BACKEND={_BACKEND})")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)


# The versions under which this worker's `xdist_group` marks were lost
# (`pytest_collection_finish`); empty where they hold.
_LOST_GROUPS = []


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    _freeze_the_imports()
    _note_lost_groups(session)


def _freeze_the_imports():
    """Leave what collection imported out of every later garbage collection.

    TensorFlow, Keras, keras-hub, JAX and LiteRT hold millions of Python
    objects that live as long as the process, and a full collection visits
    them all: the TFLite converter calls `gc.collect()` at every conversion
    (about 0.27 s each in a test process: 15 of one process's 94 s of CPU
    in three export modules, docs/contributing.md). `gc.freeze()` moves
    them to a generation no collection visits; the objects the tests make
    are collected as before."""
    gc.collect()
    gc.freeze()


def _note_lost_groups(session):
    """Note a `--dist loadgroup` worker that lost the groups.

    pytest-xdist groups a worker's tests by the `@group` it appends to
    their ids in its own `pytest_collection_modifyitems`; where a pytest
    release stores ids elsewhere (9.2 with xdist 3.8), the groups are
    silently ignored and every module's shared model is built on both
    processes: CI slower by minutes, every test still passing. The grouped
    tests then fail, naming the versions (`_groups_kept`)."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    if any(
        "@" not in item.nodeid and any(True for _ in item.iter_markers("xdist_group"))
        for item in session.items
    ):
        import xdist

        versions = f"pytest-xdist {xdist.__version__}, pytest {pytest.__version__}"
        _LOST_GROUPS.append(versions)


@pytest.fixture(autouse=True)
def _groups_kept(request):
    if _LOST_GROUPS and request.node.get_closest_marker("xdist_group"):
        pytest.fail(
            f"--dist loadgroup ignored this test's xdist_group ({_LOST_GROUPS[0]}): "
            "install the versions pyproject.toml's test extra allows",
            pytrace=False,
        )


def _shares_a_module_fixture(item):
    """Whether `item` uses a module- or class-scoped fixture of its own
    module (a model built or trained once for the module's tests). With
    `pytest -n 2 --dist loadgroup` (.ci/run) such a module's tests run on
    one worker, which builds the model once; spread over two, each would
    build it."""
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(
        d.scope in ("module", "class") and d.baseid.split("::")[0] == module
        for defs in definitions
        for d in defs
    )


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True)
def _numpy_reads_torch_outputs(monkeypatch):
    """On PyTorch, `np.asarray(output)` reads a layer output's detached value.

    The tests read results with `np.asarray` (and pass tensors to
    `np.testing`), as on TensorFlow and JAX; PyTorch refuses that for a
    tensor that is part of an autograd graph (every layer output, since the
    weights require grad). Reading the detached value changes no computation.

    This is a per-test fixture of tests/, not a process-wide patch: the
    docstring examples in kerasnorm/ (collected in the same run) must work
    for a PyTorch user as written, so they read outputs with
    `keras.ops.convert_to_numpy` and run without it.
    """
    if _BACKEND != "torch":
        return
    import torch

    tensor_array = torch.Tensor.__array__

    def detached_array(self, dtype=None, copy=None):
        return tensor_array(self.detach(), dtype)

    monkeypatch.setattr(torch.Tensor, "__array__", detached_array)
