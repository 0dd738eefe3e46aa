"""The data contract shared by datasets, towers, training, evaluation and serving.

Training examples (``tf.data`` elements) are dicts of scalars, batched by the input pipeline:

    {"caption": tf.string,      # raw UTF-8 caption (tokenised inside the text tower's graph)
     "image":   tf.string,      # encoded JPEG/PNG bytes (decoded and resized inside the image tower's graph)
     "image_id": tf.int64}      # id of the image; all captions of one image share it

A training pipeline given the image tower's decoder (``train_pipeline(decode=...)``) replaces ``"image"`` by
``"pixels"`` (float32 [S, S, 3] in [0, 1], what the tower's decoder makes of the bytes); the model takes either.

Evaluation works on a whole split at once, with unique images and all their captions (:class:`RetrievalSplit`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

CAPTION, IMAGE, IMAGE_ID = "caption", "image", "image_id"
PIXELS = "pixels"  # decoded images, when the training pipeline decodes them


@dataclasses.dataclass
class RetrievalSplit:
    """A retrieval test set: captions are queries, unique images are documents.

    ``caption_ids[i]`` is the id of the image caption i describes; ``image_ids[j]`` the id of image j.
    An image may have no caption, and a caption's id may be absent from ``image_ids`` (no relevant document).
    """

    captions: list[str]
    caption_ids: np.ndarray  # int64 [num_captions]
    images: list[bytes]  # encoded JPEG/PNG bytes
    image_ids: np.ndarray  # int64 [num_images]
    name: str = "split"

    def __post_init__(self):
        self.caption_ids = np.asarray(self.caption_ids, dtype=np.int64)
        self.image_ids = np.asarray(self.image_ids, dtype=np.int64)
        if len(self.captions) != len(self.caption_ids):
            raise ValueError(f"{len(self.captions)} captions but {len(self.caption_ids)} caption ids")
        if len(self.images) != len(self.image_ids):
            raise ValueError(f"{len(self.images)} images but {len(self.image_ids)} image ids")
        if len(set(self.image_ids.tolist())) != len(self.image_ids):
            raise ValueError("image ids must be unique within a RetrievalSplit")
