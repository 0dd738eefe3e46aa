"""The retrieval task: the one place that turns an :class:`ExperimentConfig` into what ``model.fit`` needs.

In the manner of TF Model Garden's tasks, :class:`RetrievalTask` builds, from one config,

    data (global batch)  ->  model (towers + λ)  ->  loss (λ from the model, see ``loss_wiring``)
                         ->  two optimizers (text, image)  ->  callbacks (loss schedule, validation)

and nothing else in the package reads ``cfg.loss`` or decides which loss gets which λ. The trainer
(:mod:`ce_retrieval.training.trainer`) owns the run around it: strategy, precision policy, checkpoints, resume.

Replica scaling: the model this task builds all-gathers the embeddings, so every replica computes the loss
``L`` of the **global** batch; its train step differentiates ``L / R`` and Keras sums the replicas' gradients,
which gives exactly ``dL/dθ`` (``docs/architecture.md``). Losses themselves never scale for replicas, so this
holds for every registered loss; :meth:`RetrievalTask.describe` reports it with the replica count.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING

import tensorflow as tf

from ce_retrieval.tasks.loss_wiring import build_loss, build_regularizers

if TYPE_CHECKING:
    import tf_keras

    from ce_retrieval.losses.base import RetrievalLoss
    from ce_retrieval.modeling.two_tower import TwoTowerModel


@dataclasses.dataclass
class RetrievalTask:
    """Builds the two-tower model, its loss, optimizers and callbacks from an ``ExperimentConfig``."""

    config: object  # ExperimentConfig (typed loosely so the config package stays free of this import)

    # ------------------------------------------------------------------------------------------------- data
    def steps_per_epoch(self) -> int:
        """``train.steps_per_epoch``, or one pass over the training captions (needs a known dataset size)."""
        cfg = self.config
        if cfg.train.steps_per_epoch:
            return int(cfg.train.steps_per_epoch)
        from ce_retrieval import data

        n = int(tf.data.experimental.cardinality(data.load_examples(cfg.data, "train")).numpy())
        if n < 0:
            raise ValueError("the training set's size is unknown; set train.steps_per_epoch")
        if n < cfg.train.batch_size:
            raise ValueError(f"the training split has {n} captions, fewer than train.batch_size={cfg.train.batch_size}")
        return n // cfg.train.batch_size

    def build_dataset(self) -> tf.data.Dataset:
        """The training pipeline at the global batch size, shuffled with ``train.shuffle_seed`` (null: ``train.seed``),
        sharded by data under a multi-worker strategy. Images arrive decoded by the image tower's own decoder
        (``modeling.decode_image``), in tf.data's threads rather than in the train step (``benchmarks/scale/
        decode_in_pipeline.py``)."""
        from ce_retrieval import data
        from ce_retrieval.modeling.image_tower import decode_image

        cfg = self.config
        order = cfg.train.seed if cfg.train.shuffle_seed is None else cfg.train.shuffle_seed
        decode = functools.partial(decode_image, image_size=cfg.model.image.image_size, resize=cfg.model.image.resize)
        dataset = data.train_pipeline(cfg.data, "train", cfg.train.batch_size, seed=order, decode=decode)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return dataset.with_options(options)

    # ------------------------------------------------------------------------------------------ model + loss
    def build_loss(self) -> RetrievalLoss:
        """The configured loss with λ from ``model.logit_scale`` (see :mod:`ce_retrieval.tasks.loss_wiring`)."""
        return build_loss(self.config.loss, self.config.model)

    def build_regularizers(self) -> list[tuple[float, RetrievalLoss]]:
        """``[(weight, loss)]`` of ``loss.regularizers``, added by the retrieval objective on the cosine matrix."""
        return build_regularizers(self.config.loss)

    def build_model(self, vocab_path: str) -> TwoTowerModel:
        """The uncompiled two-tower model (towers, augmentation, λ)."""
        from ce_retrieval import modeling

        return modeling.build_two_tower(self.config.model, vocab_path)

    def build_optimizers(self, total_steps: int) -> tuple[tf_keras.optimizers.Optimizer, tf_keras.optimizers.Optimizer]:
        """(text optimizer, image optimizer) with their learning-rate schedules over ``total_steps``."""
        from ce_retrieval import modeling

        return modeling.build_optimizers(self.config.train.optimizer, total_steps)

    def build_compiled_model(self, vocab_path: str, total_steps: int) -> TwoTowerModel:
        """Model, loss and optimizers, compiled. Call inside the strategy scope."""
        model = self.build_model(vocab_path)
        text_optimizer, image_optimizer = self.build_optimizers(total_steps)
        model.compile(
            loss=self.build_loss(),
            regularizers=self.build_regularizers(),
            text_optimizer=text_optimizer,
            image_optimizer=image_optimizer,
            jit_compile=self.config.train.jit_compile,
            on_bad_batch=self.config.train.on_bad_batch,
            embedding_chunk=self.config.train.embedding_chunk,
            loss_partition=self.config.train.loss_partition,
            loss_tile_size=self.config.train.loss_tile_size,
        )
        return model

    # ------------------------------------------------------------------------------------------- callbacks
    def build_callbacks(self, model, out_dir: str) -> list:
        """Callbacks the task needs: the loss's step schedule (A-Softmax's annealed λ, ``annealed`` losses)
        and validation every ``evaluation.every_n_epochs`` (logged as ``val_*`` metrics)."""
        callbacks = []
        loss = model.retrieval_loss
        if loss.annealed:
            from ce_retrieval.losses import AnnealingStepCallback

            callbacks.append(AnnealingStepCallback(loss))
        cfg = self.config
        if cfg.evaluation.every_n_epochs:
            from ce_retrieval import data
            from ce_retrieval.evaluation.callback import RetrievalEvaluationCallback

            callbacks.append(
                RetrievalEvaluationCallback(
                    data.load_retrieval_split(cfg.data, cfg.evaluation.split),
                    every_n_epochs=cfg.evaluation.every_n_epochs,
                    batch_size=cfg.evaluation.batch_size,
                    log_dir=os.path.join(out_dir, "logs", "validation"),
                )
            )
        return callbacks

    def describe(self, model, strategy) -> str:
        """One line for the log: loss, λ, replicas."""
        cfg = self.config
        loss = model.retrieval_loss
        if cfg.model.learn_logit_scale:
            scale = f"learned λ from {cfg.model.logit_scale:g}"
        elif loss.has_logit_scale:
            scale = f"λ {cfg.model.logit_scale:g}"
        else:
            scale = "no logit scale"
        if cfg.model.logit_bias is not None:
            scale += f", {'learned ' if cfg.model.learn_logit_bias else ''}b from {cfg.model.logit_bias:g}"
        for weight, term in model.objective.regularizers:
            scale += f"; + {weight:g}·{type(term).__name__} on cosines"
        replicas = strategy.num_replicas_in_sync
        objective = model.objective
        path = objective.path(cfg.train.batch_size)
        share = (
            "its rows' share of the global-batch loss"
            if objective.partition == "sharded"
            else f"the global-batch loss / {replicas}"
        )
        return (
            f"loss {type(loss).__name__} ({scale}; {path}), {replicas} replica(s) ({type(strategy).__name__}), "
            f"each differentiating {share}"
        )


__all__ = ["RetrievalTask"]
