"""End to end (``benchmarks/losses/dml_comparison.py``): training a small embedding with each proxy loss improves
Recall@1, MAP@R and NMI on unseen classes (NCA and LMNN are exercised end to end through model.fit in
test_dml_proxy_layers.py)."""

import pytest

from benchmarks.losses import dml_comparison
from benchmarks.losses.toy_data import make_labelled_data
from ce_retrieval.losses import SoftTripleLoss

compare_losses, format_table = dml_comparison.compare_losses, dml_comparison.format_table


@pytest.mark.slow
def test_proxy_losses_improve_recall_and_nmi():
    data = make_labelled_data(num_classes=12, per_class=24, nuisance_scale=1.5, noise=0.4, seed=2)
    losses = ["ProxyNCALoss", "ProxyAnchorLoss", SoftTripleLoss(proxies_per_class=2), "CentroidUpperBoundLoss"]
    results = compare_losses(
        losses,
        data=data,
        steps=400,
        split="classes",
        learning_rate=1e-2,
        proxy_lr_multiplier=1.0,
        embedding_dim=8,
        hidden=32,
        classes_per_batch=6,
        seed=2,
    )
    base = results["untrained"]
    for name in ("ProxyNCALoss", "ProxyAnchorLoss", "SoftTripleLoss", "CentroidUpperBoundLoss"):
        assert results[name]["recall@1"] > base["recall@1"] + 0.15, (name, results[name], base)
        assert results[name]["nmi"] > base["nmi"] + 0.1, (name, results[name], base)
        assert results[name]["map@r"] > base["map@r"] + 0.06, (name, results[name], base)
    table = format_table(results)
    assert "ProxyAnchorLoss" in table and "recall@1" in table and len(table.splitlines()) == len(results) + 1
    with pytest.raises(ValueError, match="split"):
        compare_losses([], data=data, split="random")


def test_cli_arguments():
    import argparse

    parser = argparse.ArgumentParser()
    dml_comparison.add_arguments(parser)
    args = parser.parse_args(["--losses", "NCALoss", "LMNNLoss", "--steps", "5", "--split", "samples"])
    assert args.losses == ["NCALoss", "LMNNLoss"] and args.steps == 5 and args.split == "samples"
