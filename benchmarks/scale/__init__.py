"""Benchmarks at scale: large global batches (tiled, sharded, gradient caching, SigLIP against OpenCLIP), the
train step's throughput and the main job's wall time."""
