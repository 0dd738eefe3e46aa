"""ce_retrieval.training."""
