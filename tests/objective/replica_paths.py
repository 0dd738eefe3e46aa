"""What the multi-replica harness checks, shared by objective_replicas.py (the subprocess) and
test_objective_replicas.py (which asserts that R = 2 covers it). Imports no strategy: the
subprocess must configure its logical devices before TensorFlow runs any op."""

from ce_retrieval import losses


def family_with_every_path() -> list[str]:
    """The softmax-family losses that run on every path (dense, tiled, sharded, sharded + tiled), registry order."""
    return [
        n
        for n in losses.available()
        if issubclass(losses.lookup(n), losses.SoftmaxFamilyLoss)
        and losses.lookup(n).supports_tiled
        and losses.lookup(n).supports_sharded
    ]
