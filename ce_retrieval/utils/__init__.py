"""Small shared utilities (atomic file writes, fingerprints)."""
