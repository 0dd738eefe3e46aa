"""Benchmarks of retrieval quality: the paper tables, the calibration suite over dataset families and seeds, the
precision promises, the recipe and the demo's range over seeds."""
