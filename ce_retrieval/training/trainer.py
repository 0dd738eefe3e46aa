"""Trains a two-tower model from an :class:`ExperimentConfig` with ``model.fit``.

The program is the same under every strategy (Model Garden style: a strategy scope, a model, a dataset, fit):

    strategy → precision policy → task (:class:`~ce_retrieval.tasks.RetrievalTask`: data at the global batch,
    model + loss + two optimizers built in scope, callbacks) → fit

``model_dir`` layout: ``config.yaml`` (resolved config), ``vocab.txt``, ``backup/`` (``BackupAndRestore``: a
killed run restarts where the last backup left it, same total step count), ``checkpoints/{latest,best}/``
(atomic weight checkpoints), ``logs/`` (TensorBoard), ``train_summary.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import TYPE_CHECKING

import tensorflow as tf
import tf_keras

from ce_retrieval.configs import save_yaml
from ce_retrieval.tasks import RetrievalTask
from ce_retrieval.training import distribute
from ce_retrieval.training.callbacks import ResumePoint, ThroughputLogger, WeightsCheckpoint
from ce_retrieval.utils.atomic import atomic_write_text
from ce_retrieval.utils.seeding import seed_everything

if TYPE_CHECKING:
    from ce_retrieval.configs.experiment import ExperimentConfig
    from ce_retrieval.modeling.two_tower import TwoTowerModel


class _QuietPfor:
    """Drops TensorFlow's per-op "Using a while_loop for converting ..." warnings: keras-cv's augmentation layers
    draw per-image random numbers inside ``vectorized_map``, which falls back to a loop for those ops and logs one
    line per op and trace (dozens per epoch). The fallback is expected and correct; the lines are noise."""

    def filter(self, record) -> bool:
        return "Using a while_loop for converting" not in record.getMessage()


def _quiet_known_noise() -> None:
    logger = tf.get_logger()
    if not any(isinstance(f, _QuietPfor) for f in logger.filters):
        logger.addFilter(_QuietPfor())


def steps_per_epoch(cfg) -> int:
    """Configured steps, or one pass over the training captions (see :meth:`RetrievalTask.steps_per_epoch`)."""
    return RetrievalTask(cfg).steps_per_epoch()


def prepare_process(cfg) -> tuple[tf.distribute.Strategy, str]:
    """The process-wide set-up of a training run: ``(strategy, precision policy)``, the policy set, the seeds and
    op determinism (``train.deterministic``). Call first thing in the process: the strategy may split the CPU into
    logical devices, which must happen before TensorFlow runs an op (``benchmarks/scale/train_scale.py`` shares it)."""
    strategy = distribute.make_strategy(cfg.train)  # first: may split the CPU into logical devices
    _quiet_known_noise()
    policy = distribute.precision_policy(cfg.train, strategy)
    tf_keras.mixed_precision.set_global_policy(policy)
    seed_everything(cfg.train.seed, deterministic=cfg.train.deterministic)  # after the strategy: it starts TF
    return strategy, policy


def train(cfg, model_dir: str, extra_callbacks=(), print_fn=print) -> dict:
    """Runs (or resumes) training; returns the summary that is also written to ``train_summary.json``."""
    from ce_retrieval import data

    strategy, policy = prepare_process(cfg)
    task = RetrievalTask(cfg)
    task.build_loss()  # a wrong loss.name / loss.kwargs fails here, before any data or vocabulary work
    model_dir = os.path.abspath(model_dir)
    out_dir = distribute.worker_dir(model_dir)
    _check_resumable(cfg, model_dir, os.path.join(out_dir, "backup"))
    os.makedirs(out_dir, exist_ok=True)
    if distribute.is_chief():
        save_yaml(cfg, os.path.join(model_dir, "config.yaml"))
    vocab_path = data.vocab_path_for(cfg.data, out_dir)  # out_dir/vocab.txt (given file copied, or learned)

    spe = task.steps_per_epoch()
    total_steps = spe * cfg.train.epochs
    dataset = task.build_dataset()

    with strategy.scope():
        model = task.build_compiled_model(vocab_path, total_steps)

    resume_point = ResumePoint(print_fn=print_fn if distribute.is_chief() else None)
    callbacks = [
        ThroughputLogger(cfg.train.batch_size, print_fn=print_fn if distribute.is_chief() else None),
        *task.build_callbacks(model, out_dir),
        *extra_callbacks,
        tf_keras.callbacks.BackupAndRestore(
            os.path.join(out_dir, "backup"), save_freq=cfg.train.backup_every_steps, delete_checkpoint=True
        ),
        resume_point,  # after BackupAndRestore: reads the step it restored
        WeightsCheckpoint(
            os.path.join(out_dir, "checkpoints"),
            monitor=cfg.evaluation.monitor if cfg.evaluation.every_n_epochs else None,
            mode=cfg.evaluation.monitor_mode,
            keep=cfg.train.keep_checkpoints,
        ),
        tf_keras.callbacks.TensorBoard(
            os.path.join(out_dir, "logs"), update_freq=cfg.train.tensorboard_update_freq, profile_batch=0
        ),
    ]
    if print_fn and distribute.is_chief():
        print_fn(
            f"[train] {cfg.name}: {task.describe(model, strategy)}, policy {policy}, "
            f"global batch {cfg.train.batch_size}, "
            f"{cfg.train.epochs} epochs x {spe} steps"
        )
    start = time.perf_counter()
    history = model.fit(
        dataset, epochs=cfg.train.epochs, steps_per_epoch=spe, callbacks=callbacks, verbose=cfg.train.verbose
    )
    summary = {
        "name": cfg.name,
        "loss": cfg.loss.name,
        "steps": int(model.text_optimizer.iterations.numpy()),
        "resumed_from_step": resume_point.step,
        "epochs": cfg.train.epochs,
        "seconds": time.perf_counter() - start,
        "num_replicas": strategy.num_replicas_in_sync,
        "policy": policy,
        "history": {k: [float(x) for x in v] for k, v in history.history.items()},
    }
    if distribute.is_chief():
        atomic_write_text(os.path.join(model_dir, "train_summary.json"), json.dumps(summary, indent=2))
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
    return summary


def _check_resumable(cfg, model_dir: str, backup_dir: str) -> None:
    """A backup left by a killed run is resumed only under the config that run had (it was written over
    ``config.yaml`` at its start); under another config the run stops, naming the keys, before anything is written."""
    from ce_retrieval.training.config_changes import config_changes

    if not (os.path.isdir(backup_dir) and os.listdir(backup_dir)):
        return
    changed = config_changes(cfg, os.path.join(model_dir, "config.yaml"))
    if changed:
        raise ValueError(
            f"{model_dir} holds the backup of a killed run with another config ({'; '.join(changed)}): resume it "
            "with that config, or train into another model_dir"
        )


def load_trained(model_dir: str, which: str = "best") -> tuple[ExperimentConfig, TwoTowerModel]:
    """(config, model) of a trained ``model_dir`` with weights restored from ``checkpoints/<which>``
    (``best`` falls back to ``latest`` when no validation ran)."""
    from ce_retrieval import configs, modeling

    config_path = os.path.join(model_dir, "config.yaml")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{model_dir} is not a trained model directory (no config.yaml)")
    cfg = configs.load_experiment(config_path)
    model = modeling.build_two_tower(cfg.model, os.path.join(model_dir, "vocab.txt"))
    model.text_encoder(tf.constant(["warm up"]))  # create the variables before restoring
    candidates = [which] if which != "best" else ["best", "latest"]
    for name in candidates:
        path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints", name))
        if path:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
            model.checkpoint_path = path
            return cfg, model
    raise FileNotFoundError(f"no checkpoint under {os.path.join(model_dir, 'checkpoints')} ({'/'.join(candidates)})")
