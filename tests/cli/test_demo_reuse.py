"""The main job reuses a trained model only if it was trained with the config it would train now, and the trainer
resumes a backup only under its run's config (``cli/demo.py: _train_once``, ``training/config_changes.py``): a model
of another config is refused, naming the keys, never mixed into a run's figures."""

import dataclasses
import re

import pytest

from ce_retrieval import configs
from ce_retrieval.cli import demo
from ce_retrieval.cli.train import resolve_config
from ce_retrieval.training.config_changes import config_changes
from ce_retrieval.utils.dataclass_yaml import save_yaml


def _finished(model_dir, cfg):
    model_dir.mkdir(parents=True)
    save_yaml(cfg, str(model_dir / "config.yaml"))
    (model_dir / "train_summary.json").write_text("{}")


def test_a_finished_model_of_the_same_config_is_reused(tmp_path, capsys, monkeypatch):
    cfg = configs.load_experiment(resolve_config("synthetic_demo"), ["train.seed=3"])
    _finished(tmp_path / "model", cfg)
    monkeypatch.setattr("ce_retrieval.training.train", lambda *a, **k: pytest.fail("trained again"))
    demo._train_once(cfg, str(tmp_path / "model"), retrain=False)
    assert "already trained with this config" in capsys.readouterr().out


def test_a_model_of_another_config_is_refused_with_the_keys(tmp_path):
    cfg = configs.load_experiment(resolve_config("synthetic_demo"), [])
    old = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, logit_scale=7.0))
    _finished(tmp_path / "model", old)
    shipped = re.escape(f"7.0 -> {cfg.model.logit_scale}")
    with pytest.raises(SystemExit, match=rf"another config \(model.logit_scale: {shipped}\): pass --retrain"):
        demo._train_once(cfg, str(tmp_path / "model"), retrain=False)
    assert config_changes(cfg, str(tmp_path / "none" / "config.yaml")) == [f"no config.yaml in {tmp_path / 'none'}"]
    many = configs.load_experiment(resolve_config("synthetic_demo"), ["train.seed=9", "train.epochs=9"])
    assert len(config_changes(many, str(tmp_path / "model" / "config.yaml"), limit=1)) == 2  # one, then "2 more"


def test_a_backup_of_another_config_is_not_resumed(tmp_path):
    """The trainer: a killed run's backup is resumed only under that run's config (nothing is written otherwise)."""
    from ce_retrieval.training import train

    cfg = configs.load_experiment(resolve_config("synthetic_demo"), [])
    old = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=cfg.train.seed + 1))
    model_dir = tmp_path / "model"
    (model_dir / "backup" / "chief").mkdir(parents=True)
    (model_dir / "backup" / "chief" / "checkpoint").write_text("x")
    save_yaml(old, str(model_dir / "config.yaml"))
    saved = (model_dir / "config.yaml").read_text()
    with pytest.raises(ValueError, match=r"backup of a killed run with another config \(train.seed: 1 -> 0\)"):
        train(cfg, str(model_dir))
    assert (model_dir / "config.yaml").read_text() == saved
