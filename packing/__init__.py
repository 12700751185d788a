"""Floor 2, pure packing: the cluster model, pod policy, fit and reasons, the placer protocol,
the strategies, and :func:`packing.decide.decide`. No I/O, no caches, no HTTP: the extender,
the operator commands and the benchmarks all place pods with this code (docs/architecture.md)."""
