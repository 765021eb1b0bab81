"""The request as it goes upstream: which client headers pass, the ones the gateway adds, and the body.

Used by :class:`~bcs_middleware.apps.proxy.UpstreamProxy` for every request, upgrades included;
the rules (what is dropped and why) are on that class's documentation.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from typing import Any

from ..core import environ as env
from ..core.bodies import body_stalled, declared_length
from ..core.cache import Cache
from ..core.errors import BadRequest, BCSError
from ..core.http import HOP_BY_HOP, named_by_connection
from ..core.impersonation import impersonation_headers
from ..core.shapes import small_shape

#: A ``trusted_proxies`` entry.
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never forwarded from the client, whatever else happens: framing is ours,
# Host is the upstream's, credentials are replaced, and Expect would make the
# upstream wait for a 100 we already answered.
_REQUEST_DROP = HOP_BY_HOP | {"host", "authorization", "content-length", "expect", "remote-user"}
# Identity a server behind us may believe from whoever connects to it: Kubernetes'
# impersonation and front-proxy (requestheader) headers, and the auth-proxy ones.
_IDENTITY_PREFIXES = ("impersonate-", "x-remote-", "x-auth-request-")
# Request bodies are sent in pieces of this size, never read whole.
_PIECE = 64 * 1024


# What the request side does with a client header, decided once per header name.
_PASS, _DROP, _FORWARDED = 0, 1, 2


def _classify_header(environ_key: str) -> tuple[str, str, int]:
    """``HTTP_X_FOO`` → (``X-Foo``, ``x-foo``, what to do with it)."""
    name = environ_key[5:].replace("_", "-")
    lower = name.lower()
    if lower in _REQUEST_DROP or lower.startswith(_IDENTITY_PREFIXES):
        kind = _DROP
    elif lower.startswith("x-forwarded-") or lower == "forwarded":
        kind = _FORWARDED
    else:
        kind = _PASS
    return name.title(), lower, kind


# Long names (a client's, up to 8 KiB) are classified without being remembered.
_header_info: Cache[str, tuple[str, str, int]] = Cache(
    max_entries=512, loader=_classify_header, admit=lambda key: len(key) <= 128)


_Plan = tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...]]


def _scan_headers(keys: tuple[str, ...]) -> _Plan:
    """For an environ's keys (in order): the headers to pass as ``(key, Name, lower)``, and
    the ``X-Forwarded-*``/``Forwarded`` ones as ``(key, lower)``; the rest are dropped.
    """
    passing, forwarded = [], []
    for key in keys:
        if key.startswith("HTTP_"):
            name, lower, kind = _header_info(key)
            if kind == _PASS:
                passing.append((key, name, lower))
            elif kind == _FORWARDED:
                forwarded.append((key, lower))
    return tuple(passing), tuple(forwarded)


# The scan of the whole environ (thirty-odd keys under gunicorn), once per shape.
_header_plan: Cache[tuple[str, ...], _Plan] = Cache(max_entries=256, loader=_scan_headers, admit=small_shape)


def _names_lowered(fields: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """The lower-cased names of ``Upstream.set_headers`` (one tuple per user: cached)."""
    return frozenset(name.lower() for name, _ in fields)


_lower_names: Cache[tuple[tuple[str, str], ...], frozenset[str]] = Cache(max_entries=256, loader=_names_lowered)


def request_headers(
    environ: dict[str, Any], upstream: env.Upstream, trusted: tuple[Network, ...]
) -> list[tuple[str, str]]:
    """The headers that go upstream: the client's that may pass, ``X-Forwarded-*``, then the
    upstream's credential, impersonation and own fields (in that order: later ones win)."""
    remote = environ.get("REMOTE_ADDR", "")
    passing, forwarded = _header_plan(tuple(environ))
    connection = environ.get("HTTP_CONNECTION")
    # Fields the client's Connection names (beyond the hop-by-hop set) and the ones
    # the upstream sets itself are not passed; usually there are none of either.
    skip = named_by_connection(connection) if connection else frozenset()
    if upstream.set_headers:
        skip = skip | _lower_names(upstream.set_headers)
    if skip:
        headers = [(name, environ[key]) for key, name, lower in passing if lower not in skip]
    else:
        headers = [(name, environ[key]) for key, name, _ in passing]
    forwarded_for = forwarded_proto = forwarded_host = None
    if forwarded and trusted and _is_trusted(remote, trusted):
        for key, lower in forwarded:
            if lower in skip:
                continue
            value = environ[key]
            if lower == "x-forwarded-for":
                forwarded_for = value
            elif lower == "x-forwarded-proto":
                forwarded_proto = value
            elif lower == "x-forwarded-host":
                forwarded_host = value
            else:
                headers.append((_header_info(key)[0], value))
    content_type = environ.get("CONTENT_TYPE")
    if content_type:
        headers.append(("Content-Type", content_type))
    if remote:
        headers.append(
            ("X-Forwarded-For", f"{forwarded_for}, {remote}" if forwarded_for else remote)
        )
    proto = forwarded_proto or environ.get("wsgi.url_scheme", "http")
    headers.append(("X-Forwarded-Proto", proto))
    host = forwarded_host or environ.get("HTTP_HOST")
    if host:
        headers.append(("X-Forwarded-Host", host))
    if upstream.bearer_token:
        headers.append(("Authorization", f"Bearer {upstream.bearer_token}"))
    if upstream.impersonate is not None:
        headers.extend(impersonation_headers(upstream.impersonate))
    headers.extend(upstream.set_headers)
    return headers


def _is_trusted(remote: str, trusted: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    return any(address in network for network in trusted)




def request_body(environ: dict[str, Any]) -> tuple[Iterable[bytes] | None, int | None]:
    stream = environ["wsgi.input"]
    length = declared_length(environ)
    if length is not None:
        return (_sized_body(stream, length) if length else None), length
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        if not environ.get("wsgi.input_terminated"):
            # Without the server marking the end of the input we could only
            # guess where the body ends; refuse rather than hang or truncate.
            raise BCSError(
                "this server cannot stream chunked request bodies; send Content-Length",
                status=411,
                code_name="LENGTH_REQUIRED",
            )
        return _chunked_body(stream), None
    return None, None


def _sized_body(stream: Any, remaining: int) -> Iterator[bytes]:
    while remaining > 0:
        try:
            piece = stream.read(min(_PIECE, remaining))
        except TimeoutError:
            raise body_stalled() from None
        # Servers raise their own types when the client breaks off its body.
        except Exception:
            raise BadRequest("the request body ended before its Content-Length") from None
        if not piece:
            raise BadRequest("the request body ended before its Content-Length")
        remaining -= len(piece)
        yield piece


def _chunked_body(stream: Any) -> Iterator[bytes]:
    while True:
        try:
            piece = stream.read(_PIECE)
        except TimeoutError:
            raise body_stalled() from None
        except Exception:
            raise BadRequest("the chunked request body is malformed or was cut off") from None
        if not piece:
            return
        yield piece
