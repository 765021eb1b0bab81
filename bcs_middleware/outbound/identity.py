"""An upstream identity: what two connections must share for one to stand in for the other."""

from __future__ import annotations

from typing import NamedTuple


class PoolKey(NamedTuple):
    """An upstream identity: address and every TLS setting. Connections are never shared across keys."""

    # A tuple, not a frozen dataclass: built and looked up on every request, and a
    # tuple's hash and equality are the C ones.
    scheme: str
    host: str
    port: int
    ca_pem: str | None
    server_name: str | None
    verify: bool
    client_cert: tuple[str, str] | None
    # The cluster whose agent tunnel carries the connection; None: dialled directly.
    tunnel: str | None = None
