"""The streaming upstream proxy (terminal app) and the transport that owns upstream connections."""

from __future__ import annotations

from .proxy import UpstreamProxy, app_factory
from .transport import PooledTransport, Transport

__all__ = ["PooledTransport", "Transport", "UpstreamProxy", "app_factory"]
