"""Where permission data comes from: a file, or an HTTP endpoint of the organisation's auth system.

A source's :meth:`~PermissionSource.poll` returns new :class:`~.model.Permissions`
when the data changed, ``None`` when it did not, and raises
:class:`SourceError` (cannot fetch) or :class:`~.model.PermissionsError` (bad
data). The service keeps the last good permissions on either error, so a broken
file or a half-written answer never revokes anything.

* :class:`FileSource` (YAML or JSON) is re-read when its size, mtime or inode
  changes — an atomic rename (what ConfigMap mounts and editors do) is seen too.
* :class:`HTTPSource` polls with ``If-None-Match`` (a ``304`` costs no parsing
  and changes nothing), presents a bearer token read from a file at every poll
  (so a rotated token is picked up), verifies TLS (system store or a CA file),
  and bounds the answer's size and the whole request's time. It calls over the
  gateway's one outbound transport (:mod:`bcs_middleware.outbound.transport`):
  its codec, pool, address policy and error translation.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from ..core import environ as env
from ..outbound.causes import ConnectError, OutboundError, Timeout, TLSError
from ..outbound.transport import Transport, default_transport
from .model import MAX_DOCUMENT, Permissions, load_permissions

log = logging.getLogger(__name__)


class SourceError(Exception):
    """The data could not be fetched; the message is safe to log (no token, no URL credentials)."""


class PermissionSource(Protocol):
    """What the RBAC service polls."""

    #: a label for logs and the status page (never a credential).
    name: str

    def poll(self, *, force: bool = False) -> Permissions | None:
        """New permissions, ``None`` if unchanged; ``force`` skips a poll interval's wait."""
        ...


class FileSource:
    """Permission data in a local YAML/JSON file.

    :param path: the file; it may not exist yet (an error until it does).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"file:{self.path}"
        self._seen: tuple[int, int, int] | None = None
        self._digest: str | None = None

    def poll(self, *, force: bool = False) -> Permissions | None:
        if force:
            self._seen = None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise SourceError(f"{self.path}: {exc.strerror}") from None
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self._seen:
            return None
        if st.st_size > MAX_DOCUMENT:
            self._seen = seen
            raise SourceError(f"{self.path} is larger than {MAX_DOCUMENT} bytes")
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_DOCUMENT + 1)
        except OSError as exc:
            raise SourceError(f"{self.path}: {exc.strerror}") from None
        # Remember the stat only once read, so an error is retried at the next poll
        # while bad *content* is not re-parsed (and re-logged) until it changes.
        self._seen = seen
        permissions = load_permissions(data)
        if permissions.digest == self._digest:
            return None
        self._digest = permissions.digest
        return permissions


def _redact(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class HTTPSource:
    """Permission data served over HTTP(S), polled with ETags.

    :param url: ``https://…`` endpoint answering the JSON/YAML document.
    :param token_file: file holding the bearer token to present (read at every poll).
    :param ca_file: CA bundle to verify the server with; default the system store.
    :param verify: ``False`` only when an operator explicitly turned checking off (logged).
    :param connect_timeout: kept for compatibility; connecting is bounded by the
        transport's connect timeout and ``timeout``.
    :param timeout: seconds for the whole request, body included.
    :param max_bytes: the largest document accepted.
    :param poll_interval: seconds between polls; :meth:`poll` returns ``None`` in between.
    :param transport: the outbound transport (the gateway's); default the process's.

    A bearer token is never sent over plain ``http://`` — that configuration is refused.
    """

    def __init__(self, url: str, *, token_file: str | Path | None = None, ca_file: str | Path | None = None,
                 verify: bool = True, connect_timeout: float = 5.0, timeout: float = 30.0,
                 max_bytes: int = MAX_DOCUMENT, poll_interval: float = 30.0,
                 transport: Transport | None = None) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"rbac source URL must be http(s), not {scheme!r}")
        if scheme == "http" and token_file is not None:
            raise ValueError("a bearer token is never sent over plain http: use an https:// rbac source URL")
        self.url = url
        self.name = f"url:{_redact(url)}"
        self.token_file = Path(token_file) if token_file is not None else None
        self.ca_file = Path(ca_file) if (verify and ca_file) else None
        self.verify = verify
        self._origin = f"{scheme}://{parts.netloc.rpartition('@')[2]}"
        self._path = parts.path or "/"
        self._query = parts.query
        if not verify:
            log.warning("rbac: TLS verification of %s is turned OFF by configuration", self.name)
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.poll_interval = poll_interval
        self.etag: str | None = None
        self.fetches = 0
        self.not_modified = 0
        self._next_poll = 0.0
        self._digest: str | None = None
        self._transport = transport

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise SourceError(f"cannot read the rbac source token file {self.token_file}: {exc.strerror}") from None
        if not token:
            raise SourceError(f"the rbac source token file {self.token_file} is empty")
        return token

    def poll(self, *, force: bool = False) -> Permissions | None:
        now = time.monotonic()
        if not force and now < self._next_poll:
            return None
        self._next_poll = now + self.poll_interval
        headers = [("Accept", "application/json, application/yaml;q=0.9")]
        token = self._token()
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        if self.etag:
            headers.append(("If-None-Match", self.etag))
        upstream = env.Upstream(base_urls=(self._origin,), path=self._path, query=self._query,
                                ca_pem=self._ca_pem(), verify=self.verify, name=self.name)
        deadline = now + self.timeout
        self.fetches += 1
        transport = self._transport or default_transport()
        try:
            # Each wait bounded by the whole request's time (connecting also by the
            # transport's connect timeout); the body loop below checks the deadline.
            response = transport.send(upstream, "GET", headers, None, None, timeout=self.timeout)
        except OutboundError as cause:
            raise _source_error(self.name, cause) from None
        try:
            if response.status == 304:
                self.not_modified += 1
                return None
            if response.status != 200:
                raise SourceError(f"{self.name} answered HTTP {response.status}")
            declared = response.length_remaining
            if declared is not None and declared > self.max_bytes:
                raise SourceError(f"{self.name}: document larger than {self.max_bytes} bytes")
            chunks: list[bytes] = []
            size = 0
            try:
                while chunk := response.read1(65536):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise SourceError(f"{self.name}: document larger than {self.max_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise SourceError(f"{self.name}: answer took longer than {self.timeout:.0f}s")
                    chunks.append(chunk)
            except OutboundError as cause:
                raise _source_error(self.name, cause) from None
            etag = next((value for key, value in response.headers if key.lower() == "etag"), None)
        finally:
            response.release_conn()
        # Remembered before parsing: a bad document is not re-fetched and re-logged
        # until the server has a new version of it.
        self.etag = etag
        permissions = load_permissions(b"".join(chunks))
        if permissions.digest == self._digest:
            return None
        self._digest = permissions.digest
        return permissions

    def _ca_pem(self) -> str | None:
        # Read at every poll, like the token: a rotated CA file is picked up (the
        # transport keeps one TLS context per distinct bundle).
        if self.ca_file is None:
            return None
        try:
            return self.ca_file.read_text()
        except (OSError, UnicodeError) as exc:
            raise SourceError(f"cannot read the rbac source CA file {self.ca_file}: {exc}") from None

    def close(self) -> None:
        """Nothing of its own to close: connections belong to the shared transport."""


def _source_error(name: str, cause: OutboundError) -> SourceError:
    """The one place an outbound cause becomes a :class:`SourceError` (hosts only, no token, no URL credentials)."""
    if isinstance(cause, Timeout):
        return SourceError(f"{name}: timed out")
    if isinstance(cause, TLSError):
        return SourceError(f"{name}: TLS certificate verification failed")
    if type(cause) is ConnectError:  # not the address policy's refusal: its message says more
        return SourceError(f"{name}: connection refused or host unreachable")
    return SourceError(f"{name}: {cause.message}")
