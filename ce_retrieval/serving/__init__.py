"""ce_retrieval.serving."""
