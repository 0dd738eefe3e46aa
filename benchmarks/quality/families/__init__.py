"""The calibration suite's dataset families (shapes, vague captions, digit scenes), written in real formats and read
by the library's real loaders. Benchmark data, not library: nothing in ``ce_retrieval`` imports them."""
