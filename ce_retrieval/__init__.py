"""ce_retrieval: Cross-Example Softmax and deep metric learning for two-tower image-text retrieval.

Importing the package changes nothing about the process: it works in any order with TensorFlow and Keras, and
never sets ``TF_USE_LEGACY_KERAS``. The Keras-2 parts (the two-tower model, its towers, the ``RetrievalLoss``
classes) import ``tf_keras`` explicitly; the same losses for Keras 3 are in :mod:`ce_retrieval.keras`. The one
dependency that follows the process-wide switch is keras-cv (the image tower's backbone), which says so when it
is used; the ``ce-retrieval`` command sets the switch itself (``ce_retrieval.cli``).
"""

__version__ = "0.1.0"

# Known noise, silenced narrowly: keras-cv's backbones read the deprecated `Model.state_updates` / `layer.updates`
# properties while tracking layers (every export and model build prints both warnings); nothing a user can act on.
import warnings as _warnings

_warnings.filterwarnings(
    "ignore",
    message=r"`(Model\.state_updates|layer\.updates)` will be removed",
    category=UserWarning,
    module="keras_cv",
)
