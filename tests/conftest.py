"""Shared test set-up: Keras 2 for keras-cv (set by the test process, as the ce-retrieval command does), quiet
TensorFlow, deterministic seeds, a fresh Keras session per test, and one guard: every pinned outside library the
tests compare with (pytorch-metric-learning, torch, faiss, TensorFlow Similarity, scikit-learn, netcal, MAPIE) must
be installed at its pin, or the run fails before any test (no ``importorskip``).

Compilation for graphs that run once or twice: a test traces a step, runs it and compares, so the optimisations
that pay off over thousands of training steps cost more than they save. In the test processes Grappler's graph
rewrites are off, and XLA's CPU code is generated without LLVM's optimisation passes (``XLA_FLAGS``, inherited by
the subprocesses the tests start, unless set already): the same computations, other float rounding at most (e.g.
no fused multiply-add), which the tests' tolerances already allow (a test that compares bits with a fresh
``ce-retrieval train`` process turns Grappler back on for its run: test_train_e2e.py). The XLA-heavy tests take
about a quarter less CPU time. Outside the tests (training, the demo, the benchmarks) both are on."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import reference_packages  # noqa: E402  (tests/ is on sys.path: rootdir conftest)
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from tensorflow.python.framework import config as tf_config  # noqa: E402  (op determinism has no public off switch)

import ce_retrieval  # noqa: E402,F401

pytest_plugins = ["export_fixtures"]  # tests/export_fixtures.py: the export the build, search and serve tests share


def pytest_configure(config):
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})  # module docstring
    missing = reference_packages.problems()
    if missing:
        raise pytest.UsageError(
            "pinned reference packages the tests compare with are missing or at another version "
            "(install requirements-dev.txt):\n  " + "\n  ".join(missing)
        )


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    tf_keras.backend.clear_session()
    tf_keras.mixed_precision.set_global_policy("float32")
    # Every test starts from the same random state whatever ran before it on this worker (tf.random.set_seed resets
    # neither Keras's seed generator nor TF's global Generator, which train.deterministic replaces process-wide).
    tf_keras.utils.set_random_seed(0)  # Python, NumPy, TF and Keras's own seed generator for unseeded initialisers
    tf.random.set_global_generator(tf.random.Generator.from_seed(0))
    yield
    tf_keras.mixed_precision.set_global_policy("float32")
    # train(deterministic=True) turns op determinism on process-wide; a later test on the same worker must not
    # inherit it (XLA has no deterministic MaxPool gradient, so an XLA step after a training test would fail).
    if tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(config, items):
    """Test files holding a ``slow`` test run first, the rest after, each file's tests in their own order: with
    two xdist workers, a long test that starts last leaves one core idle while it finishes (the sort is
    deterministic, so every worker collects the same order). xdist keeps this order only with
    ``--no-loadscope-reorder`` (scripts/test.sh); by default it sends files with the most tests first, which put the
    one-test end-to-end files last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: within a group, collection order
