"""WeightsCheckpoint removes what a checkpoint save killed by SIGKILL left behind (found by
``benchmarks/serving/reliability.py``: a kill while ``ckpt-1`` was written left ``checkpoints/latest/ckpt-1_temp/``
forever, because the resumed run restored from the BackupAndRestore backup and never saved number 1 again)."""

import os

import tf_keras

from ce_retrieval.training.callbacks import WeightsCheckpoint


def _model():
    model = tf_keras.Sequential([tf_keras.layers.Dense(2)])
    model.build((None, 3))
    return model


def test_stale_files_of_a_killed_save_are_removed_on_restart(tmp_path):
    first = WeightsCheckpoint(str(tmp_path), monitor="val_x")
    first.set_model(_model())
    first.on_epoch_end(0, {"val_x": 1.0})  # a finished save: ckpt-1 in latest/ and best/
    latest, best = tmp_path / "latest", tmp_path / "best"
    (latest / "ckpt-2_temp").mkdir()  # what a kill during the save of ckpt-2 leaves
    (latest / "ckpt-2_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    (latest / "ckpt-3.data-00000-of-00001").write_bytes(b"x")  # merged data, index never written
    (latest / "checkpoint.tmp0123abcd").write_text("partial state")
    (best / ".best.json.0123abcd.tmp.json").write_text("{")
    resumed = WeightsCheckpoint(str(tmp_path), monitor="val_x")
    resumed.set_model(_model())
    resumed.on_epoch_end(3, {"val_x": 0.5})  # resumed past the killed epochs: saves ckpt-4
    assert sorted(os.listdir(latest)) == sorted(
        ["checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001", "ckpt-4.index", "ckpt-4.data-00000-of-00001"]
    )
    assert sorted(os.listdir(best)) == sorted(["checkpoint", "best.json", "ckpt-1.index", "ckpt-1.data-00000-of-00001"])
    assert resumed.best == 1.0  # the best value so far was read back, not reset
