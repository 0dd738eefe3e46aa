"""Distribution strategies from config, and the chief/worker bookkeeping Keras needs.

* ``default``: the current (single-device) strategy.
* ``mirrored``: all local GPUs; on a CPU-only machine ``num_cpu_replicas`` logical CPU devices (how the tests
  check that embeddings are gathered across replicas). Splitting the CPU must happen before TensorFlow runs
  its first op, so call :func:`make_strategy` first thing in a process.
* ``multi_worker``: ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``. Every worker runs the same program;
  only the chief writes to ``model_dir``, the others write to a private scratch directory (Keras requires
  every worker to save, or the chief blocks waiting for them).
* ``tpu``: ``TPUStrategy`` from ``TPUClusterResolver(tpu=...)``. This path is configured but cannot be tested
  on this project's CI (no TPU): it follows the documented TF 2.20 recipe.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf


def configure_cpu_replicas(n: int) -> list[str]:
    """Splits the physical CPU into ``n`` logical devices (idempotent); returns their names."""
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if not current or len(current) != n:
        try:
            tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError as exc:
            raise RuntimeError(
                f"cannot split the CPU into {n} logical devices: TensorFlow already ran an op in this process. "
                "Create the strategy before building models or datasets."
            ) from exc
    return [d.name for d in tf.config.list_logical_devices("CPU")][:n]


def make_strategy(train_cfg) -> tf.distribute.Strategy:
    kind = train_cfg.strategy
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        n = max(int(train_cfg.num_cpu_replicas), 1)
        return tf.distribute.MirroredStrategy(configure_cpu_replicas(n))
    if kind == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("train.strategy=multi_worker needs the TF_CONFIG environment variable (cluster and task)")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=train_cfg.tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"unknown strategy {kind!r}")


def precision_policy(train_cfg, strategy) -> str:
    """The Keras mixed-precision policy name: explicit, or ``auto`` by accelerator."""
    if train_cfg.mixed_precision != "auto":
        return train_cfg.mixed_precision
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16"
    if tf.config.list_physical_devices("GPU"):
        return "mixed_float16"
    return "float32"


def task_info() -> tuple[str | None, int]:
    """(task type, task id) from TF_CONFIG, or (None, 0) outside a cluster."""
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = cfg.get("task", {})
    return task.get("type"), int(task.get("index", 0))


def is_chief() -> bool:
    """True for the process that owns ``model_dir``: no cluster, the ``chief`` task, or worker 0 without a chief."""
    task_type, task_id = task_info()
    if task_type is None or task_type == "chief":
        return True
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


def worker_dir(model_dir: str) -> str:
    """``model_dir`` for the chief; a private scratch directory inside it for every other worker."""
    if is_chief():
        return model_dir
    task_type, task_id = task_info()
    return os.path.join(model_dir, ".workers", f"{task_type}_{task_id}")
