"""Value types and the interface every discovery source implements.

An :class:`Endpoint` is one registered service instance, in the ZooKeeper layout
of the source system (driver and scheduler nodes carry exactly these JSON
fields), so nodes written by existing Go drivers and schedulers read back here
and nodes written here read back there.

A :class:`Discovery` answers from memory only: ``drivers()`` and
``scheduler_master()`` never wait on the network, so a request is never held up
by the discovery source; ``stale()`` says the answer may be out of date.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..core.bodies import parse_json
from ..core.errors import BadRequest

DEFAULT_ROOT = "/bcs/services/endpoints"
DRIVER_DIR = "mesosdriver"
SCHEDULER_DIR = "scheduler"
APISERVER_DIR = "apiserver"

_SEQUENCE = re.compile(r"(\d{10})$")


def node_sequence(name: str) -> int | None:
    """The sequence number ZooKeeper appended to a sequential node name (10 digits)."""
    match = _SEQUENCE.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Endpoint:
    """One service instance, as registered in ZooKeeper.

    Field names are the source layout's JSON keys; ``port``/``metric_port``/
    ``external_port`` are integers (0 = not set), the rest strings.
    """

    ip: str
    port: int
    metric_port: int = 0
    hostname: str = ""
    scheme: str = "http"
    version: str = ""
    cluster: str = ""
    pid: int = 0
    external_ip: str = ""
    external_port: int = 0

    def base_url(self, prefer_external: bool = False) -> str:
        """``scheme://host:port``; with ``prefer_external`` the external address when
        both ``external_ip`` and ``external_port`` are set (as bcs-api chose)."""
        host, port = self.ip, self.port
        if prefer_external and self.external_ip and self.external_port:
            host, port = self.external_ip, self.external_port
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme or 'http'}://{shown}:{port}"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str | dict[str, Any]) -> Endpoint:
        """Parse node data; missing fields take defaults and unknown ones are ignored.

        :raises ValueError: not a JSON object, or no usable ``ip``/``port``.
        """
        try:
            raw = parse_json(data, what="endpoint data") if isinstance(data, bytes | str) else data
        except BadRequest as exc:
            raise ValueError(exc.message) from None
        if not isinstance(raw, dict):
            raise ValueError("endpoint data is not a JSON object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in raw or raw[f.name] is None:
                continue
            value = raw[f.name]
            if f.type == "int":
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"endpoint field {f.name!r} is not a number") from None
            else:
                value = str(value)
            values[f.name] = value
        if not values.get("ip") or not values.get("port"):
            raise ValueError("endpoint data has no ip/port")
        scheme = str(values.get("scheme") or "http").lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"endpoint scheme {scheme!r} is not http(s)")
        values["scheme"] = scheme
        return cls(**values)

    @classmethod
    def from_url(cls, url: str, *, cluster: str = "") -> Endpoint:
        """An endpoint from ``http(s)://host:port`` (static configuration)."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(ip=parts.hostname, port=port, scheme=parts.scheme, cluster=cluster)


@runtime_checkable
class Discovery(Protocol):
    """Where drivers and schedulers are found; every method answers from memory."""

    def drivers(self, cluster_id: str) -> tuple[Endpoint, ...]:
        """The live drivers of a cluster (empty when none is known)."""
        ...

    def registered(self, cluster_id: str) -> bool:
        """Whether a driver of the cluster ever registered (its directory exists, or it is configured).

        Tells "no such Mesos cluster" (404) from "its drivers are all gone" (503).
        """
        ...

    def scheduler_master(self) -> Endpoint | None:
        """The scheduler with the lowest sequence number, or ``None``."""
        ...

    def schedulers(self) -> tuple[Endpoint, ...]:
        """Every live scheduler, master first."""
        ...

    def stale(self) -> bool:
        """``True`` while the source is unreachable and the last snapshot serves."""
        ...

    def close(self) -> None: ...
