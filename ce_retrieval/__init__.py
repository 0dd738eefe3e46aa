"""ce_retrieval: Cross-Example Softmax and deep metric learning for two-tower image-text retrieval.

Importing the package selects legacy Keras 2 (``tf_keras``) as ``tf.keras``, which tf-models-official,
tensorflow-hub, keras-cv's legacy path and tensorflow-similarity require. This must happen before TensorFlow
is first imported, so it is done here, once, and users never have to set ``TF_USE_LEGACY_KERAS`` themselves.
"""

import os
import sys

__version__ = "0.1.0"

if "tensorflow" in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    # TensorFlow was imported first without the flag: tf.keras is then Keras 3 and cannot be switched.
    import tensorflow as _tf

    if not _tf.keras.layers.Dense.__module__.startswith("tf_keras"):
        raise ImportError(
            "ce_retrieval needs legacy Keras 2 (tf_keras) as tf.keras, but TensorFlow was imported before "
            "ce_retrieval without TF_USE_LEGACY_KERAS=1. Import ce_retrieval first, or set "
            "TF_USE_LEGACY_KERAS=1 in the environment."
        )
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Known noise, silenced narrowly: keras-cv's backbones read the deprecated `Model.state_updates` / `layer.updates`
# properties while tracking layers (every export and model build prints both warnings); nothing a user can act on.
import warnings as _warnings  # noqa: E402

_warnings.filterwarnings(
    "ignore",
    message=r"`(Model\.state_updates|layer\.updates)` will be removed",
    category=UserWarning,
    module="keras_cv",
)
