"""λ for an objective chosen on the validation split: each objective compared at its own best temperature.

A small sweep trains the heads once per candidate λ (one seed, one feature draw) and keeps the λ whose validation
figures score best, ``score(λ) = PR-AUC_val(λ) + R@1_val(λ)`` (text → image): one number that weighs threshold
relevancy and top-1 retrieval equally. The test split is never read: the runs get the features without their
``test_*`` arrays. An objective with a learned temperature (SigLIP's t and b) is not swept.
"""

from __future__ import annotations

from benchmarks.quality import suite_objectives as so


def choose_scale(objective, features: dict, scales, *, seed: int = 0, **heads_kwargs) -> tuple[float, list[dict]]:
    """``(λ, sweep)``: the candidate of ``scales`` with the best validation score and one row per candidate
    (``{"scale", "pr_auc", "t2i_r1", "score"}``); ``(so.SCALE, [])`` without candidates or for a learned
    temperature. ``heads_kwargs`` go to ``heads.train_heads`` (batch, steps, jit_compile)."""
    from benchmarks.quality import heads

    if not scales or objective.learned_scale_bias:
        return so.SCALE, []
    val_only = {k: v for k, v in features.items() if not k.startswith("test_")}
    sweep = []
    for scale in scales:
        loss_fn, extra = so.heads_loss(objective, scale)
        steps = heads_kwargs["steps"]
        out = heads.train_heads(
            val_only, loss_fn, seed=seed, extra_variables=extra, selection=True, eval_every=steps, **heads_kwargs
        )
        sweep.append({"scale": float(scale), **out["val"], "score": out["val"]["pr_auc"] + out["val"]["t2i_r1"]})
    best = max(sweep, key=lambda r: r["score"])
    return best["scale"], sweep
