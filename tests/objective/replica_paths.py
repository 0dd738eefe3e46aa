"""What the multi-replica harness checks, shared by objective_replicas.py (the subprocess) and
test_objective_replicas.py (which asserts what each R checked). Imports no strategy: the
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


# the paths checked beside the dense one: (partition, tile, bidirectional, learned λ) for the family, (partition,
# tile) for SigLIP with learned t and b
FAMILY_PATHS = [("replicated", 3, False, False), ("sharded", 0, True, True), ("sharded", 3, True, True)]
SIGLIP_PATHS = [("replicated", 3), ("sharded", 0), ("sharded", 3)]
# checked at R = 4 too: a cross-example loss with mining (global histograms), a pair loss and a proxy loss (class-proxy
# weights summed over replicas) on the dense path; the sharded + tiled paths that combine the cross-example partition
# function, the mining histograms and SigLIP's learned b across replicas and tiles
AT_FOUR = {
    "CrossExampleNegativeMining/replicated",
    "MultiSimilarityLoss/replicated",
    "ProxyNCALoss/replicated",
    "CrossExampleSoftmax/sharded/tile3/bi1/learn1",
    "CrossExampleNegativeMining/sharded/tile3/bi1/learn1",
    "SigmoidLoss/sharded/tile3/learn1",
}
# also checked inside a tf.function (as training runs them)
GRAPH_TOO = {"CrossExampleNegativeMining/sharded/tile3/bi1/learn1", "SigmoidLoss/sharded/tile3/learn1"}


def every_key(registered: list[str], family: list[str]) -> set[str]:
    """Every loss and path the harness knows (objective_replicas.py's keys): what R = 2 checks."""
    keys = {f"{n}/replicated" for n in registered}
    for partition, tile, bidirectional, learn in FAMILY_PATHS:
        keys |= {f"{n}/{partition}/tile{tile}/bi{int(bidirectional)}/learn{int(learn)}" for n in family}
    return keys | {f"SigmoidLoss/{partition}/tile{tile}/learn1" for partition, tile in SIGLIP_PATHS}
