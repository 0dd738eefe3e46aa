"""The experiment config: data, model, loss, training and evaluation, as one typed tree.

YAML files in ``configs/`` fill it (``configs/synthetic_demo.yaml`` is the embedded default); see
:mod:`ce_retrieval.utils.dataclass_yaml` for the loading and override rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ce_retrieval.data.config import DataConfig
from ce_retrieval.modeling.config import ModelConfig, OptimizerConfig

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass
class RegularizerConfig:
    """One term ``weight · R(relevance, cosine)`` added to the loss: a registered loss without a logit scale, by
    name (``ThresholdConsistentMargin``), with its hyper-parameters, on the text × image cosine matrix (never the
    logits λ·S, whether λ is fixed or learned)."""

    name: str = "ThresholdConsistentMargin"
    weight: float = 1.0
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.weight >= 0:
            raise ValueError(f"loss.regularizers: weight must be >= 0, got {self.weight}")


@dataclasses.dataclass
class LossConfig:
    """Which loss trains the model: any registered class of ``ce_retrieval.losses`` by name, and its
    hyper-parameters except λ (λ is ``model.logit_scale``; :class:`ce_retrieval.tasks.RetrievalTask` builds the
    loss and gives it λ), plus ``regularizers`` added to it (e.g. ``[{name: ThresholdConsistentMargin}]``: the
    objective is ``loss + Σ weight · R``)."""

    name: str = "CrossExampleSoftmax"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    regularizers: list[RegularizerConfig] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainConfig:
    """``model.fit`` settings. ``batch_size`` is the GLOBAL batch (split across replicas, gathered for the loss)."""

    batch_size: int = 64
    epochs: int = 10
    steps_per_epoch: int | None = None  # None: one pass over the training captions
    strategy: str = "default"  # default | mirrored | multi_worker | tpu
    num_cpu_replicas: int = 0  # mirrored on a machine without GPUs: split the CPU into this many logical devices
    tpu: str = ""  # TPU name/address for TPUStrategy ("" = local / from the environment)
    mixed_precision: str = "auto"  # auto: mixed_bfloat16 on TPU, mixed_float16 on GPU, float32 on CPU
    jit_compile: bool = False
    on_bad_batch: str = "stop"  # a NaN/Inf loss or gradient, or no positive pair: stop (error naming the step) | skip
    # Gradient caching (GradCache): embed in chunks of this many rows per replica, same gradient, one chunk's
    # activations in memory; must divide the per-replica batch; 0 or null: off (docs/architecture.md)
    embedding_chunk: int | None = None
    # Loss partition over replicas: replicated (every replica computes the whole [B, B] loss; OpenCLIP
    # local_loss=False) | sharded (each replica its own B/R rows against the gathered images, shares summed: same
    # gradient, R x less loss work; OpenCLIP local_loss=True; losses that supports_sharded; docs/losses.md)
    loss_partition: str = "replicated"
    # Loss over column tiles of this many documents, without the [B, B] matrix (O(B·T) memory, same value and
    # gradients; losses that supports_tiled): 0 = dense (default) | T | auto (tiled above 2^26 logits, i.e.
    # B > 8192; dense for a loss without a tiled path); composes with loss_partition and embedding_chunk
    loss_tile_size: int | str = 0
    seed: int = 0
    # The training pipeline's shuffle order: null = seed. Set apart from seed (initial weights, augmentation),
    # it varies the batch order alone, or the weights alone with the order fixed
    shuffle_seed: int | None = None
    deterministic: bool = True  # tf.config.experimental.enable_op_determinism(): same seed, same model (slower on GPU)
    backup_every_steps: int = 50  # BackupAndRestore frequency (resume after a kill loses at most this many steps)
    keep_checkpoints: int = 3
    tensorboard_update_freq: int = 20
    verbose: int = 1  # Keras progress: 0 silent, 1 progress bar, 2 one line per epoch
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"train.strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.on_bad_batch not in ("stop", "skip"):
            raise ValueError(f"train.on_bad_batch must be 'stop' or 'skip', got {self.on_bad_batch!r}")
        chunk = self.embedding_chunk or 0
        if chunk < 0 or (chunk and self.batch_size % chunk):
            raise ValueError(
                f"train.embedding_chunk must be 0/null (off) or divide train.batch_size ({self.batch_size}) and the "
                f"per-replica batch, got {self.embedding_chunk}"
            )
        if self.loss_partition not in ("replicated", "sharded"):
            raise ValueError(f"train.loss_partition must be 'replicated' or 'sharded', got {self.loss_partition!r}")
        tile = self.loss_tile_size
        if tile != "auto" and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 0):
            raise ValueError(
                f"train.loss_tile_size must be 0 (dense), a positive tile width or 'auto' (tiled above 2^26 logits), "
                f"got {tile!r}"
            )
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"train.mixed_precision must be one of {PRECISIONS}, got {self.mixed_precision!r}")
        if self.batch_size < 2:
            raise ValueError(f"train.batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if self.epochs < 1:
            raise ValueError(f"train.epochs must be >= 1, got {self.epochs}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError(f"train.steps_per_epoch must be >= 1 or null, got {self.steps_per_epoch}")


@dataclasses.dataclass
class EvalConfig:
    """Validation during training (every ``every_n_epochs``) and the ``evaluate`` command's defaults."""

    split: str = "val"
    every_n_epochs: int = 1  # 0 disables evaluation during training
    monitor: str = "val_pr_auc"  # metric that selects the best checkpoint (any logged val_* metric)
    monitor_mode: str = "max"
    distractors: int = 0  # extra gallery images relevant to nothing (paper Table 1, right half)
    batch_size: int = 128
    # Promised precisions: each served with a threshold guaranteed with confidence 1 - delta (evaluation.guarantee)
    precision_levels: tuple = (0.5, 0.8, 0.9)
    delta: float = 0.1

    def __post_init__(self):
        if not 0.0 < float(self.delta) < 1.0:
            raise ValueError(f"evaluation.delta must be in (0, 1), got {self.delta}")
        if not self.precision_levels or any(not 0.0 < float(p) < 1.0 for p in self.precision_levels):
            raise ValueError(f"evaluation.precision_levels must be in (0, 1), got {self.precision_levels}")


@dataclasses.dataclass
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    evaluation: EvalConfig = dataclasses.field(default_factory=EvalConfig)
