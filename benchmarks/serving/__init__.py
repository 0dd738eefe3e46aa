"""Benchmarks of serving: ANN and threshold search on generated galleries, sharded indexes, the HTTP service
under load and malformed requests, Beam embedding."""
