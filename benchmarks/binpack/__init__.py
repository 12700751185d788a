"""Bin-packing benchmark on the public Alibaba GPU trace (openb), replayed through the
extender's own scoring code. Run ``python -m benchmarks.binpack --help``; see docs/binpack.md."""
