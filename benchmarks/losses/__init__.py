"""Benchmarks of the losses: cost of a forward+backward against Sampled Softmax, and whether each loss trains."""
