"""GPU metrics exporter: per-card NVML telemetry and per-pod attribution for Prometheus."""
