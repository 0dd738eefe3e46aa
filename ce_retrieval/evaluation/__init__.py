"""ce_retrieval.evaluation."""
