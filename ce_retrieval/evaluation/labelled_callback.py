"""A Keras callback that logs class-labelled retrieval metrics of a held-out set during ``model.fit``.

Proxy and pair losses train models whose output is a similarity matrix, not an embedding, so the callback
takes the embedding model separately (a sub-model sharing the trained layers, e.g.
``tf_keras.Model(inputs, embeddings)``) and evaluates it with
:func:`ce_retrieval.evaluation.labelled.labelled_retrieval_metrics` every ``every`` epochs. Metrics enter
``logs`` as ``val_recall@1``, ``val_map@r``, ... so ``History``, ``EarlyStopping`` and ``ModelCheckpoint``
can use them.
"""

from __future__ import annotations

import numpy as np
import tf_keras

from ce_retrieval.evaluation.labelled import labelled_retrieval_metrics


class LabelledRetrievalCallback(tf_keras.callbacks.Callback):
    """Logs ``prefix + metric`` for ``embedding_model(x)`` against ``labels`` at the end of epochs."""

    def __init__(
        self,
        embedding_model,
        x,
        labels,
        ks=(1, 2, 4, 8),
        every: int = 1,
        compute_nmi: bool = False,
        batch_size: int = 1024,
        prefix: str = "val_",
    ):
        super().__init__()
        if every < 1:
            raise ValueError(f"LabelledRetrievalCallback: every must be >= 1, got {every}")
        self.embedding_model = embedding_model
        self.x = x
        self.labels = np.asarray(labels)
        self.ks = ks
        self.every = int(every)
        self.compute_nmi = compute_nmi
        self.batch_size = int(batch_size)
        self.prefix = prefix

    def on_epoch_end(self, epoch, logs=None) -> None:
        if (epoch + 1) % self.every:
            return
        embeddings = self.embedding_model.predict(self.x, batch_size=self.batch_size, verbose=0)
        metrics = labelled_retrieval_metrics(embeddings, self.labels, ks=self.ks, compute_nmi=self.compute_nmi)
        if logs is not None:
            logs.update({self.prefix + name: float(value) for name, value in metrics.items()})


__all__ = ["LabelledRetrievalCallback"]
