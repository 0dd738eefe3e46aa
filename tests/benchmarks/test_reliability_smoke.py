"""``benchmarks/serving/reliability.py --quick`` end to end (issue #15): one SIGKILL of a tiny training run during a
checkpoint write, then resume; the HTTP service under load while versions are published; the malformed-request
corpus. Fails if an invariant breaks (a temporary / partial checkpoint file left, a failed request, an answer
other than 4xx with a reason). The export/index kill part is left to the full run (it needs ~1 min alone).

The training runs under MirroredStrategy on two logical CPUs (``train.strategy=mirrored``, the multi-GPU path of one
machine): this is the suite's check that a run killed after a backup resumes from it (not from step 0) to the step
count of an uninterrupted run, and says so."""

import pytest

from benchmarks.serving import reliability as bench


@pytest.mark.slow
def test_reliability_quick(tmp_path):
    lines = []
    records = bench.run(
        ["train", "service", "bad"],
        True,
        str(tmp_path),
        kills=1,
        seed=0,
        gallery=2000,
        duration_s=0.5,
        publish_every_s=0.5,
        rss_requests=300,
        bad_rounds=1,
        train_override="train.strategy=mirrored,train.num_cpu_replicas=2",
        print_fn=lines.append,
    )
    text = "\n".join(lines)
    assert [v for r in records for v in r.violations] == [], text
    train, service, bad = records
    assert train.data["steps"] == 8 and train.data["leftovers"] == 0, text
    assert train.data["num_replicas"] == 2 and 2 <= train.data["resumed_from_step"] < 8, text  # from the backup
    assert train.data["said_resumed"], text  # "[train] resumed from the backup at step N"
    assert bad.data["not_ok"] == 0 and bad.data["outcomes"] >= 2 * 50, text
    assert "| top-k (k = 10) | 32 | steady |" in text and "new version every 0.5 s" in text
    assert "Answered in all (the sum of the column): " in text and " requests, 0 failed." in text
