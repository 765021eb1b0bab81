"""Kubernetes audit events for the tunnel: :mod:`.middleware` writes them, :mod:`.policy` decides."""
