"""Metrics (Prometheus), the batching that keeps them off the request path, and the log setup."""
