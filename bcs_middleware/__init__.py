"""bcs-middleware: composable WSGI layers forming a multi-cluster container API gateway."""

from __future__ import annotations

__version__ = "0.1.0"
