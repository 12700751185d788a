"""Stowage: GPU bin-packing for Kubernetes (shared formats and the `stowage` command)."""
__version__ = "0.1.0"
