"""The command's quiet logs stay quiet through a SavedModel export: saving
one sets absl's verbosity to FATAL and back to what absl holds, which put
absl's logger back at WARNING when only the logger had been lowered, and
the demo then printed "WARNING:absl:Importing a function ... with ops with
unsaved custom gradients" lines."""

import logging

import pytest
import tensorflow as tf
from absl import logging as absl_logging

from kerasnorm.cli import quiet_logs

pytestmark = pytest.mark.tf_only


@pytest.fixture
def restored_levels():
    loggers = [logging.getLogger(name) for name in ("absl", "tensorflow")]
    levels = [logger.level for logger in loggers]
    verbosity = absl_logging.get_verbosity()
    yield
    absl_logging.set_verbosity(verbosity)
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def _save(path):
    """A SavedModel save, which sets absl's verbosity to FATAL and back
    (TensorFlow's `AutoTrackable._trackable_children`), as every SavedModel
    export does."""
    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(path))


def test_absl_stays_at_errors_through_a_savedmodel_save(tmp_path, restored_levels):
    # What the old quiet_logs did, and what a save undoes: the logger alone
    # lowered, absl's own verbosity at its default.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)
    _save(tmp_path / "logger_only")
    assert logging.getLogger("absl").getEffectiveLevel() == logging.WARNING

    quiet_logs()
    _save(tmp_path / "quiet")
    assert logging.getLogger("absl").getEffectiveLevel() == logging.ERROR
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("absl").addHandler(handler)
    try:
        absl_logging.warning("Importing a function (%s) ...", "__inference_pruned")
    finally:
        logging.getLogger("absl").removeHandler(handler)
    assert records == []
