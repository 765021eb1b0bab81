"""One bounded GET through the gateway's outbound stack, for the sign-in code's documents.

Discovery documents, key sets (:mod:`.keys`) and distributed claims (:mod:`.claim_sources`)
are fetched the same way: through the process's one
:class:`~bcs_middleware.outbound.transport.Transport` (its address policy, verified TLS
with the issuer's ``certificateAuthority`` or the system's roots), bounded in time
(``timeout`` for connecting, every read and the whole body) and in size.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..core.environ import Upstream
from ..outbound.causes import OutboundError, Timeout, TLSError
from ..outbound.transport import Transport

__all__ = ["FetchFailed", "fetch"]


class FetchFailed(Exception):
    """Why a fetch failed; names what was fetched, never a URL's credentials or a token."""


def fetch(transport: Transport, url: str, *, what: str, timeout: float, max_bytes: int,
          ca_pem: str | None = None, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The body of a ``200`` answer to ``GET url``.

    :raises FetchFailed: no answer in time, TLS not verified, another status, too large.
    """
    parts = urlsplit(url)
    # Credentials in a URL's userinfo are never sent (nor named in an error).
    upstream = Upstream(base_urls=(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}",),
                        path=parts.path or "/", query=parts.query, ca_pem=ca_pem, verify=True,
                        name=f"oidc {parts.hostname}")
    deadline = time.monotonic() + timeout
    try:
        response = transport.send(upstream, "GET", list(headers), None, None, timeout=timeout)
    except OutboundError as cause:
        raise FetchFailed(_cause(what, cause)) from None
    try:
        if response.status != 200:
            raise FetchFailed(f"{what} answered HTTP {response.status}")
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchFailed(f"{what} larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise FetchFailed(f"{what} took longer than {timeout:g}s")
                chunks.append(chunk)
        except OutboundError as cause:
            raise FetchFailed(_cause(what, cause)) from None
    finally:
        response.release_conn()
    return b"".join(chunks)


def _cause(what: str, cause: OutboundError) -> str:
    if isinstance(cause, Timeout):
        return f"fetching the {what} timed out"
    if isinstance(cause, TLSError):
        return f"TLS certificate verification failed fetching the {what}"
    return f"fetching the {what} failed: {cause.message}"
