"""Path safety for routes that map a client path onto an upstream path (tunnel, Mesos).

A client must never reach outside the prefix it was routed under: no ``.``/``..``
segments, no backslash or NUL, and no percent-encoded ``/`` or ``\\`` (which the
server decodes in ``PATH_INFO`` but an upstream may treat as separators). The
rest is re-encoded for the upstream request line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from .cache import Cache
from .errors import BadRequest
from .routes import KUBERNETES_PREFIX as TUNNEL_PREFIX

_UNSAFE_RAW = re.compile(r"%(2f|5c)", re.IGNORECASE)
_SAFE = "/:@!$&'()*+,;=-._~"
# A path made only of characters quote() leaves alone needs no quoting (the usual case).
_PLAIN = re.compile(r"[A-Za-z0-9_/:@!$&'()*+,;=.~-]*")


def refuse_encoded_separators(raw_uri: str | None) -> None:
    """400 when the raw request line encodes a ``/`` or ``\\`` (``RAW_URI``/``REQUEST_URI``)."""
    if raw_uri is not None and _UNSAFE_RAW.search(raw_uri.split("?", 1)[0]):
        raise BadRequest("encoded '/' or '\\' is not allowed in the path", code_name="BAD_PATH")


def encode_path(path: str) -> str:
    """A decoded path (or one segment of it) percent-encoded for a request line."""
    return path if _PLAIN.fullmatch(path) else quote(path, safe=_SAFE)


def safe_rest(rest: str) -> str:
    """``rest`` (decoded, relative to a route prefix) checked and percent-encoded; 400 when unsafe."""
    if any(seg in (".", "..") for seg in rest.split("/")) or "\\" in rest or "\x00" in rest:
        raise BadRequest("the path may not contain '.' or '..' segments", code_name="BAD_PATH")
    return encode_path(rest)


@dataclass(frozen=True)
class TunnelPath:
    cluster_id: str
    rest: str  # percent-encoded path upstream, always starting with "/"


def parse_tunnel_path(path_info: str, raw_uri: str | None) -> TunnelPath | None:
    """Split a Kubernetes-route path, or return ``None`` when it is not one; 400 when unsafe.

    Called once per request, by :func:`bcs_middleware.core.facts.classify`.
    """
    if not path_info.startswith(TUNNEL_PREFIX):
        return None
    return _parsed((path_info, raw_uri))


# A client repeats its paths (list, watch, get the same objects): checking and re-encoding
# one is a regex, a split and a quote, done once per path. Refusals raise and are never
# cached; memory stays bounded (1024 entries of at most _CACHED_PATH characters).
_CACHED_PATH = 512


def _parse_tunnel_path(path_info: str, raw_uri: str | None) -> TunnelPath:
    refuse_encoded_separators(raw_uri)
    cluster_id, sep, rest = path_info[len(TUNNEL_PREFIX):].partition("/")
    if not cluster_id or cluster_id in (".", ".."):
        raise BadRequest("missing cluster id in the tunnel path", code_name="BAD_PATH")
    # "{server_address}/version" yields "//version": a doubled slash right after the
    # cluster prefix is one slash (the source's own docs write it that way).
    return TunnelPath(cluster_id, "/" + safe_rest(rest.lstrip("/")) if sep else "/")



_parsed: Cache[tuple[str, str | None], TunnelPath] = Cache(
    max_entries=1024, loader=lambda key: _parse_tunnel_path(*key),
    admit=lambda key: len(key[0]) + len(key[1] or "") <= _CACHED_PATH)
