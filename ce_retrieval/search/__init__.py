"""ce_retrieval.search: answering queries over a gallery of unit-norm embeddings, exactly or approximately.

    exact.py       exact chunked top-k (``ExactSearch``, ``exact_search``): the reference every approximate
                   search is measured against;  arrays.py  the embedding checks the kernels share
    ann.py         the project's one ScaNN set-up (``build_scann``, ``IndexParams``) and ``ScannSearch``
    partitions.py  ball-bounded k-means leaves and the exact threshold scan they make prunable
    threshold.py   approximate threshold search (top-k grown until the k-th score < tau) and its tuning walk
    merge.py       exact merge of shards' top-k and threshold answers;  assignment.py  id -> shard rule
    gallery.py     one loaded index folder (``GalleryIndex``: brute force or ScaNN)
    layout.py      on-disk layout of an export (encoder and index version folders) that build writes and
                   search and serve read

Nothing here imports ``build``, ``serve`` or ``evaluation`` (tests/test_package_layering.py). ScaNN itself is imported
by ``gallery`` only (eagerly, see there), so importing this package stays light.
"""

from ce_retrieval.search.ann import IndexParams, ScannSearch
from ce_retrieval.search.exact import ExactSearch, exact_search

__all__ = ["ExactSearch", "IndexParams", "ScannSearch", "exact_search"]
