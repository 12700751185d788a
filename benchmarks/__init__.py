"""Benchmarks that prove Stowage's claims on real data (run as ``python -m benchmarks.<name>``)."""
