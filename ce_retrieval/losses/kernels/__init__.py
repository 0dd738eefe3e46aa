"""The compute kernels under the loss classes: tensors in, tensors out, no Keras loss and no loss module imported.

``masked.py`` (masked reductions over a relevance matrix), ``fast_paths.py`` (radix selection, positive slots,
sorted merges), ``softmax.py`` (the softmax family's pipeline on a dense ``S``), ``tiled.py`` and
``tiled_sigmoid.py`` (the same losses over column tiles from embeddings), ``sharded.py`` (a replica's share of the
softmax family). They import only each other, ``losses/relevance.py`` and ``ce_retrieval.utils``;
``tests/losses/test_losses_layering.py`` holds them to it.
"""
