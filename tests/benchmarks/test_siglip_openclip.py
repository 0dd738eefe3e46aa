"""``benchmarks/scale/siglip_openclip.py`` (issue #22): our tiled SigLIP loss and the torch chunked loss it is measured
against agree on the same inputs (the loss and its gradients w.r.t. both embedding sets, t and b), the chunked
loop meets every block once (float64, against the plain loss), and the script runs end to end on a tiny size,
leaving out the case its estimate puts over the budget."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.scale import siglip_openclip as bench


@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 8])
def test_ring_order_meets_every_block_once_starting_with_its_own(blocks):
    for rank in range(blocks):
        order = bench.ring_order(rank, blocks)
        assert order[0] == rank and sorted(order) == list(range(blocks))


def plain_siglip(img, txt, t, b):
    """SigLIP on the whole batch at once (the paper's Algorithm 1)."""
    n = img.shape[0]
    labels = 2 * torch.eye(n, dtype=img.dtype) - 1
    return -F.logsigmoid(labels * (t * img @ txt.T + b)).sum() / n


def leaves(img, txt, dtype):
    out = [torch.tensor(img, dtype=dtype), torch.tensor(txt, dtype=dtype)]
    out += [torch.tensor(bench.SCALE, dtype=dtype), torch.tensor(bench.BIAS, dtype=dtype)]
    return [x.requires_grad_() for x in out]


def value_and_grads(fn, xs):
    value = fn(*xs)
    return float(value.detach()), [g.numpy() for g in torch.autograd.grad(value, xs)]


@pytest.mark.parametrize("blocks", [2, 3, 4, 8])
def test_chunked_loss_is_the_plain_loss_in_float64(blocks):
    img, txt = bench.make_inputs(48, 16, seed=1)
    want = value_and_grads(plain_siglip, leaves(img, txt, torch.float64))
    got = value_and_grads(lambda *x: bench.chunked_siglip(*x, blocks), leaves(img, txt, torch.float64))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("mode", ["function", "xla"])
@pytest.mark.parametrize("blocks, tile", [(1, 16), (8, 16), (4, None)])
def test_ours_matches_the_chunked_openclip_loss(blocks, tile, mode):
    """Ours (tiled, several tiles; t, b folded in as the objective does) against the torch chunked loss, float32."""
    img, txt = bench.make_inputs(64, 32, seed=2)
    ours = bench.ours_runner(img, txt, tile, mode)()
    chunked = bench.torch_runner(img, txt, bench.torch_loss("openclip", blocks, None))()
    diffs = bench.relative_differences(ours, chunked)
    assert set(diffs) == {"loss", "img", "txt", "t", "b"}
    assert max(diffs.values()) < 2e-5, diffs
    assert ours[0] == pytest.approx(value_and_grads(plain_siglip, leaves(img, txt, torch.float64))[0], rel=1e-5)


def test_the_plan_estimates_what_the_chunked_loss_keeps():
    """65k: OpenCLIP's SigLipLoss needs more than the 16 GiB budget whatever W is (the blocks' logits are all kept),
    the plain one more than the 8-block one; ours is always run."""
    w8, w1 = (bench.estimate_gib("openclip", 65536, w, 128) for w in (8, 1))
    assert 16 < w8 < w1
    assert bench.estimate_gib("openclip", 16384, 8, 128) < 16 and bench.estimate_gib("ours", 65536, 1, 128) == 0


@pytest.mark.slow
def test_script_runs_end_to_end_and_leaves_out_what_exceeds_the_budget(tmp_path):
    n, dim = 64, 16
    budget = (bench.estimate_gib("openclip", n, 2, dim) + bench.estimate_gib("openclip", n, 1, dim)) / 2
    argv = ["--sizes", str(n), "--dim", str(dim), "--blocks", "2", "--repeats", "1", "--check-size", "32"]
    assert bench.main([*argv, "--budget-gib", str(budget), "--no-clip", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "siglip_openclip.json").read_text())
    rows = {(r["method"], r["blocks"]): r for r in record["rows"]}
    assert set(rows) == {("ours", 1), ("openclip", 2), ("openclip", 1)}
    assert rows[("openclip", 1)]["status"].startswith("not run: needs")
    for key in [("ours", 1), ("openclip", 2)]:
        assert rows[key]["seconds"] > 0 and rows[key]["peak_mib"] >= 0, rows[key]
    assert rows[("ours", 1)]["loss"] == pytest.approx(rows[("openclip", 2)]["loss"], rel=1e-5)
    assert rows[("openclip", 2)]["time_ratio_ours"] > 0
    assert all(max(d.values()) < 2e-5 for d in record["check"].values()), record["check"]
    assert record["machine"]["cores"] >= 1 and "benchmarks.scale.siglip_openclip" in record["command"]
    assert "| OpenCLIP SigLipLoss, W = 1 | 64 | not run: needs" in (tmp_path / "siglip_openclip.md").read_text()
