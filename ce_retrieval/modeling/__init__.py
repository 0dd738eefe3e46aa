"""ce_retrieval.modeling."""
