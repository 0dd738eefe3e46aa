"""Training callbacks: an epoch summary with throughput, and atomic latest/best weight checkpoints.

Atomicity: :class:`tf.train.CheckpointManager` writes a checkpoint's data files completely before it rewrites
the small ``checkpoint`` state file (atomically, via a temporary file and rename), so a process killed while
saving leaves the previous checkpoint as the one that ``tf.train.latest_checkpoint`` returns.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time

import tensorflow as tf
import tf_keras

from ce_retrieval.utils.atomic import atomic_write_text


class ThroughputLogger(tf_keras.callbacks.Callback):
    """Adds ``examples_per_second`` to the epoch logs and prints one summary line per epoch."""

    def __init__(self, global_batch_size: int, print_fn=print):
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.print_fn = print_fn

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._start, self._steps = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs if logs is not None else {}
        seconds = max(time.perf_counter() - self._start, 1e-9)
        logs["examples_per_second"] = self._steps * self.global_batch_size / seconds
        shown = ", ".join(
            f"{k} {v:.4f}" for k, v in logs.items() if k != "examples_per_second" and isinstance(v, (int, float))
        )
        total = self.params.get("epochs", "?") if self.params else "?"
        if self.print_fn:
            self.print_fn(
                f"[train] epoch {epoch + 1}/{total}: {shown}, {logs['examples_per_second']:.1f} examples/s, "
                f"{seconds:.1f} s"
            )


class ResumePoint(tf_keras.callbacks.Callback):
    """The optimizer step at which ``fit`` starts, read after ``BackupAndRestore`` (placed before this callback)
    restored its backup: 0 for a fresh run, the backed-up step for a run resumed after a kill. ``train`` records it
    in ``train_summary.json`` as ``resumed_from_step`` and says so when it is not 0."""

    def __init__(self, print_fn=print):
        super().__init__()
        self.print_fn = print_fn
        self.step = 0

    def on_train_begin(self, logs=None) -> None:
        self.step = int(self.model.text_optimizer.iterations.numpy())
        if self.step and self.print_fn:
            self.print_fn(f"[train] resumed from the backup at step {self.step}")


def _remove_stale_checkpoint_files(directory: str) -> None:
    """Removes what a save killed midway left in a CheckpointManager folder: a ``ckpt-N_temp/`` shard folder,
    ``ckpt-N.*`` files the ``checkpoint`` state file does not list, a ``checkpoint.tmp*`` state file, a hidden
    atomic-write temporary (``.best.json.*.tmp.json``). None of them is ever read, and a resumed run may never
    write the same number again, so they would stay forever."""
    if not os.path.isdir(directory):
        return
    state = tf.train.get_checkpoint_state(directory)
    listed = {os.path.basename(p) for p in (state.all_model_checkpoint_paths if state else [])}
    for name in os.listdir(directory):
        unlisted = name.startswith("ckpt-") and name.split(".")[0] not in listed
        temporary = name.startswith("checkpoint.tmp") or (name.startswith(".") and ".tmp" in name)  # atomic writes
        if unlisted or temporary:
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)


class WeightsCheckpoint(tf_keras.callbacks.Callback):
    """Saves the model weights at each epoch end to ``<dir>/latest`` and, when ``monitor`` improves, to ``<dir>/best``.

    Both are :class:`tf.train.CheckpointManager` directories (atomic, ``keep`` most recent). ``best/best.json``
    records the epoch and the monitored value.
    """

    def __init__(self, directory: str, monitor: str | None = "val_pr_auc", mode: str = "max", keep: int = 3):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.directory, self.monitor, self.mode, self.keep = directory, monitor, mode, keep
        self.best = -math.inf if mode == "max" else math.inf
        self._managers = None

    def _ensure(self):
        if self._managers is None:
            for name in ("latest", "best"):
                _remove_stale_checkpoint_files(os.path.join(self.directory, name))
            ckpt = tf.train.Checkpoint(model=self.model)
            self._managers = {
                name: tf.train.CheckpointManager(ckpt, os.path.join(self.directory, name), max_to_keep=self.keep)
                for name in ("latest", "best")
            }
            state = os.path.join(self.directory, "best", "best.json")
            if os.path.exists(state):  # resumed run: keep comparing against the best so far
                self.best = json.load(open(state))["value"]
        return self._managers

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs or {}
        managers = self._ensure()
        managers["latest"].save(checkpoint_number=epoch + 1)
        value = logs.get(self.monitor) if self.monitor else None
        if value is None:
            return
        value = float(value)
        better = value > self.best if self.mode == "max" else value < self.best
        if better:
            self.best = value
            path = managers["best"].save(checkpoint_number=epoch + 1)
            atomic_write_text(
                os.path.join(self.directory, "best", "best.json"),
                json.dumps(
                    {"epoch": epoch + 1, "monitor": self.monitor, "value": value, "path": os.path.basename(path)}
                ),
            )
