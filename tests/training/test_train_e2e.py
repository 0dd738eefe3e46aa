"""The trainer end to end: model.fit on the synthetic set, checkpoints, multi-worker. Resume after SIGKILL (under
MirroredStrategy) is checked by tests/benchmarks/test_reliability_smoke.py, through the reliability benchmark's kill
harness."""

import json
import os
import socket
import subprocess
import sys

import pytest
from tiny import TINY_OVERRIDE

from ce_retrieval import configs
from ce_retrieval.cli.train import resolve_config
from ce_retrieval.training import load_trained, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiny_cfg(*extra):
    return configs.load_experiment(resolve_config("synthetic_demo"), [TINY_OVERRIDE, *extra])


def _cli(model_dir, *overrides, env=None):
    cmd = [
        sys.executable,
        "-m",
        "ce_retrieval.cli",
        "train",
        "--config",
        "synthetic_demo",
        "--model_dir",
        str(model_dir),
        "--params_override",
        TINY_OVERRIDE,
    ]
    for o in overrides:
        cmd += ["--params_override", o]
    full_env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    return cmd, full_env


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory):
    """A tiny run of ``train`` in this (long-lived) test process: its model directory and printed lines. With
    Grappler's rewrites on, as in a ``ce-retrieval train`` process (the test processes turn them off,
    tests/conftest.py): they change the trained weights' last bits."""
    import tensorflow as tf

    model_dir = tmp_path_factory.mktemp("here")
    lines = []
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    try:
        summary = train(_tiny_cfg(), str(model_dir), print_fn=lines.append)
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    return model_dir, summary, lines


@pytest.mark.slow
def test_train_writes_model_dir_and_reloads(trained_here):
    tmp_path, summary, lines = trained_here
    assert summary["steps"] == 6 and summary["resumed_from_step"] == 0
    assert any("examples/s" in line for line in lines) and not any("resumed" in line for line in lines)
    for name in ("config.yaml", "vocab.txt", "train_summary.json"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "checkpoints" / "latest" / "checkpoint").exists()
    assert (tmp_path / "checkpoints" / "best" / "best.json").exists()
    assert "val_pr_auc" in summary["history"] and "examples_per_second" in summary["history"]
    backup = tmp_path / "backup"  # BackupAndRestore removes its checkpoint after a finished run
    assert not backup.exists() or not any(p.is_file() for p in backup.rglob("*"))
    cfg, model = load_trained(str(tmp_path))
    assert cfg.name == "synthetic_demo"
    emb = model.text_encoder(__import__("tensorflow").constant(["a red circle"])).numpy()
    assert emb.shape == (1, 16)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_mirrored_two_processes(tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        cmd, env = _cli(
            tmp_path / "run", "train.strategy=multi_worker,evaluation.every_n_epochs=0", env={"TF_CONFIG": tf_config}
        )
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["num_replicas"] == 2 and summary["steps"] == 6
    assert not (tmp_path / "run" / ".workers" / "worker_1").exists()  # non-chief scratch removed


@pytest.mark.slow
def test_same_seed_gives_the_same_model(tmp_path, trained_here):
    """``train.deterministic`` (default on): a fresh process trains bit-identical weights to a run with the same
    seed in this test process, which has run other tests before (another seed, other layers, mixed precision), so
    figures measured on one clone reproduce on another and nothing a process did before ``train`` leaks into it
    (that another ``train.seed`` draws other weights is checked in process: test_train_seed_reaches_the_seeding_point).
    """
    import numpy as np

    cmd, env = _cli(tmp_path / "fresh")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def weights(model_dir):
        _, model = load_trained(str(model_dir), which="latest")
        return [w.numpy() for w in model.weights]

    fresh, here = weights(tmp_path / "fresh"), weights(trained_here[0])
    assert len(fresh) == len(here) and all(np.array_equal(x, y) for x, y in zip(fresh, here, strict=True))


def test_train_seed_reaches_the_seeding_point():
    """``prepare_process`` (the first step of ``train``) seeds from ``train.seed``: the same seed draws the same
    initial weights of an unseeded layer, another seed other ones (ce_retrieval.utils.seeding's own tests cover
    Python, NumPy and TensorFlow's generators)."""
    import numpy as np
    import tf_keras

    from ce_retrieval.training.trainer import prepare_process

    def initial_kernel(seed):
        prepare_process(_tiny_cfg(f"train.seed={seed},train.deterministic=false"))
        layer = tf_keras.layers.Dense(4)
        layer.build((None, 3))
        return layer.kernel.numpy()

    first, again, other = initial_kernel(1), initial_kernel(1), initial_kernel(2)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
