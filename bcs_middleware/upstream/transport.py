"""Pooled, verified, time-bounded HTTP/1.1 connections to upstreams — the only module that opens them.

:class:`PooledTransport` keeps idle keep-alive connections per upstream
*identity* — scheme, host, port and every TLS setting (CA bundle, server name,
verification, client certificate) — so two clusters that happen to share an
address never share a connection verified against the other's CA.

Why not urllib3 or requests: measured on the proxy's hot path (bench/README.md),
urllib3's ``urlopen`` plus ``http.client``'s e-mail based header parser cost
about 350 µs of CPU per request — more than gunicorn spends serving it — and
the proxy needs none of their features (it never decodes, redirects, retries
on its own or buffers). This module speaks just the HTTP/1.1 a proxy needs,
over the stdlib's ``socket`` and ``ssl``, at a fraction of that cost.

Behaviour of :meth:`PooledTransport.send`:

* The response is returned with its headers parsed and its body unread; the
  body is relayed raw (``Content-Encoding`` untouched). Redirects are never
  followed. ``1xx`` interim responses are skipped.
* **Failover**: ``Upstream.base_urls`` are tried in order. An address whose
  connection failed less than ``failure_cooldown`` seconds ago is skipped
  (unless every address did). The next address is tried only when connecting
  failed — before a single request byte left — so a request is never sent
  twice. One exception: a body-less ``GET``/``HEAD``/``OPTIONS`` that found a
  pooled connection closed by the upstream is retried once on a fresh one.
* **Errors** are translated into the project's errors at this boundary:
  connection refused/unreachable on every address → :class:`BadGateway`;
  connect timeout or a read timeout before the response headers →
  :class:`GatewayTimeout`; a certificate that does not verify →
  :class:`BadGateway` saying so and naming the upstream host; a reset or a
  malformed answer → :class:`BadGateway`. Messages carry host names only,
  never a credential. (All addresses down is a 502, as nginx answers, not a 503.)
* **Timeouts**: ``connect_timeout`` to connect and finish the TLS handshake,
  ``read_timeout`` between bytes until the headers arrive and within bodies
  that have a ``Content-Length``; a body *without* ``Content-Length`` (a watch,
  a log follow) switches its socket to ``stream_idle_timeout`` once the
  headers are in, because such streams may legitimately stay quiet for long.
  On a plain ``http://`` connection the timeouts are the kernel's
  (``SO_RCVTIMEO``/``SO_SNDTIMEO`` on a blocking socket): a Python socket
  timeout ``poll()``s before every ``send``/``recv``, and under gunicorn's
  threads each of those syscalls is one more GIL hand-off per request. TLS
  sockets keep Python's timeout: CPython's ``SSLSocket`` retries a read that
  the kernel timed out on a blocking socket, so the kernel's timeout would
  never end it (and ``ssl`` already tries ``SSL_read`` before it polls).

**Upgrades** (:meth:`PooledTransport.open_upgrade`): the same connect,
failover, TLS and error rules, but always on a fresh connection that is never
pooled; a ``101`` answer's socket is handed to the caller (``detach()``).

**Fork safety**: nothing is opened at import or construction; pools fill on
first use. A transport that has been *used* must not be shared across a fork:
call :meth:`PooledTransport.reset` in gunicorn's ``post_fork``.
"""

from __future__ import annotations

import functools
import logging
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

from ..environ import Upstream
from ..errors import BadGateway, BadRequest, BCSError, GatewayTimeout
from .addresses import DEFAULT_POLICY, AddressPolicy

log = logging.getLogger(__name__)

Body = Iterable[bytes] | None

# Methods that may be replayed when a pooled keep-alive connection turned out
# to be closed by the upstream just as we reused it (RFC 9110 §9.2.2).
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_HEAD = 256 * 1024
_MAX_LINE = 8 * 1024
# Below glibc's mmap threshold (128 KiB): recv(n) allocates an n-byte buffer first, and a
# 256 KiB one costs an mmap/munmap pair per call — measured 17 µs against 3.6 µs for a
# 2 KiB answer (bench/README.md). Bodies are relayed in 64 KiB pieces anyway.
_RECV = 64 * 1024
_CHECK_AFTER_IDLE = 1.0
# Header fields that concern one connection only, never relayed by a proxy (RFC 9110 §7.6.1);
# so are the fields a ``Connection`` header names.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "proxy-connection",
})
# Kernel timeouts for plain connections (see the module docs); elsewhere Python's.
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")


def connection_tokens(value: str | None) -> frozenset[str]:
    """The lower-cased options of a ``Connection`` header value."""
    if not value:
        return frozenset()
    # The same few values ("keep-alive", "close") every time: remembered, unless long (a
    # client's value can be 8 KiB, and a cache of those would hold megabytes).
    return _tokens(value) if len(value) <= _CACHED_LINE else _tokens.__wrapped__(value)


def named_by_connection(value: str) -> frozenset[str]:
    """Fields a ``Connection`` value names beyond the fixed hop-by-hop set (usually none)."""
    return _named(value) if len(value) <= _CACHED_LINE else connection_tokens(value) - HOP_BY_HOP


@functools.lru_cache(maxsize=256)
def _tokens(value: str) -> frozenset[str]:
    return frozenset(token.strip().lower() for token in value.split(",") if token.strip())


@functools.lru_cache(maxsize=256)
def _named(value: str) -> frozenset[str]:
    return _tokens(value) - HOP_BY_HOP


# What a response header field is to the head parser.
_END_TO_END, _CONTENT_LENGTH, _CONNECTION, _TRANSFER_ENCODING, _HOP = range(5)
_KINDS = {"content-length": _CONTENT_LENGTH, "connection": _CONNECTION,
          "transfer-encoding": _TRANSFER_ENCODING}
# Lines up to this long are remembered parsed (see _field); longer ones are parsed each time.
_CACHED_LINE = 256


def _parse_field(line: str) -> tuple[tuple[str, str], int]:
    """``Name: value`` → ((name, value), what kind of field it is)."""
    name, sep, value = line.partition(":")
    if not sep or not name or name[0] in " \t" or name[-1] in " \t":
        raise UpstreamProtocolError("malformed header line")
    lower = name.lower()
    kind = _KINDS.get(lower, _HOP if lower in HOP_BY_HOP else _END_TO_END)
    return (name, value.strip(" \t")), kind


# An upstream repeats most of its header lines byte for byte from one answer to the next
# (Server, Content-Type, Connection, its flow-schema ids...; Date changes once a second):
# a parsed line is looked up instead of parsed again — about half the head's cost. Bounded
# in count and, through _CACHED_LINE, in size (at most 512 x 256 characters).
_field = functools.lru_cache(maxsize=512)(_parse_field)


def _timeval(seconds: float | None) -> bytes:
    """A ``struct timeval``; ``None`` (no timeout) is zero, as the kernel reads it."""
    if not seconds:
        return struct.pack("@ll", 0, 0)
    whole = int(seconds)
    # Never round a tiny positive timeout down to 0, which would mean "forever".
    return struct.pack("@ll", whole, max(int((seconds - whole) * 1e6), 0 if whole else 1))


class Response(Protocol):
    """The upstream's answer as :class:`~bcs_middleware.upstream.proxy.UpstreamProxy` uses it."""

    status: int
    reason: str
    #: every header field as received, in order.
    headers: list[tuple[str, str]]
    #: ``headers`` without the hop-by-hop fields and those ``Connection`` names: what a
    #: proxy relays. A fresh list per response (callers may extend it).
    end_to_end_headers: list[tuple[str, str]]
    #: body bytes still to come when the length is known, else ``None``.
    length_remaining: int | None

    def read1(self, amt: int) -> bytes: ...

    def read(self) -> bytes: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """What :class:`~bcs_middleware.upstream.proxy.UpstreamProxy` needs from a transport."""

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
    ) -> Response: ...

    def close(self) -> None: ...


class UpgradeTransport(Transport, Protocol):
    """A transport that can also open connection upgrades (``kubectl exec`` and the like)."""

    def open_upgrade(
        self, upstream: Upstream, method: str, headers: list[tuple[str, str]]
    ) -> UpgradeResponse: ...


class UpgradeResponse(Response, Protocol):
    """The answer to an upgrade request: a ``101``'s socket can be taken over."""

    def detach(self) -> tuple[socket.socket, bytes]: ...


class UpstreamProtocolError(ConnectionError):
    """The upstream broke the HTTP/1.1 framing or closed the connection mid-message."""


class _PoolKey(NamedTuple):
    # A tuple, not a frozen dataclass: built and looked up on every request, and a
    # tuple's hash and equality are the C ones (a dataclass's build tuples to compare).
    scheme: str
    host: str
    port: int
    ca_pem: str | None
    server_name: str | None
    verify: bool
    client_cert: tuple[str, str] | None


class _Conn:
    __slots__ = ("buf", "idle_since", "kernel_timeouts", "key", "reused", "sock", "timeout")

    def __init__(self, sock: socket.socket, key: _PoolKey) -> None:
        self.sock = sock
        self.key = key
        self.buf = b""
        self.reused = False
        self.idle_since = 0.0
        # Not under gevent either: its sockets are non-blocking underneath and wait in
        # its hub, where only Python's timeout applies.
        self.kernel_timeouts = (_KERNEL_TIMEOUTS and not isinstance(sock, ssl.SSLSocket)
                                and not type(sock).__module__.startswith("gevent"))
        self.timeout: float | None = sock.gettimeout()
        if self.kernel_timeouts:
            sock.settimeout(None)  # blocking: the kernel's timeouts below apply
            self.timeout = -1.0  # forces set_timeout to program them

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive, re-programming the socket only on a change.

        ``settimeout`` is an ``ioctl`` (a GIL release) even when nothing changes.
        """
        if seconds == self.timeout:
            return
        self.timeout = seconds
        if self.kernel_timeouts:
            value = _timeval(seconds)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        else:
            self.sock.settimeout(seconds)

    def sendall(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except BlockingIOError:  # the kernel's SO_SNDTIMEO on a blocking socket
            raise TimeoutError("send timed out") from None

    def fill(self, limit: int = _RECV) -> bool:
        try:
            data = self.sock.recv(limit)
        except BlockingIOError:  # the kernel's SO_RCVTIMEO on a blocking socket
            raise TimeoutError("receive timed out") from None
        if not data:
            return False
        self.buf = self.buf + data if self.buf else data
        return True

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                return line
            if len(self.buf) > _MAX_LINE:
                raise UpstreamProtocolError("line too long")
            if not self.fill():
                raise UpstreamProtocolError("connection closed mid-message")

    def take(self, amt: int) -> bytes:
        """Up to ``amt`` bytes: what is buffered, else one receive."""
        if not self.buf and not self.fill(max(amt, 1)):
            raise UpstreamProtocolError("connection closed mid-body")
        piece, self.buf = self.buf[:amt], self.buf[amt:]
        return piece

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Head(NamedTuple):
    """A parsed response head; the framing fields are picked out in the same pass."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    end_to_end: list[tuple[str, str]]
    transfer_encoding: str | None
    content_length: str | None
    keep_alive: bool


class UpstreamResponse:
    """An upstream response whose body is read on demand, raw.

    ``release_conn()`` returns a fully read keep-alive connection to its pool
    and closes any other; ``close()`` abandons the body and the connection.
    """

    def __init__(self, transport: PooledTransport, conn: _Conn, method: str, head: _Head,
                 reusable: bool = True) -> None:
        self.status = head.status
        self.reason = head.reason
        self.headers = head.headers
        self.end_to_end_headers = head.end_to_end
        self._transport = transport
        self._conn: _Conn | None = conn
        self._keep_alive = head.keep_alive and reusable
        self._chunked = False
        self._chunk_left = 0
        self._done = False
        self.length_remaining: int | None = None
        status = head.status
        if method == "HEAD" or status in (204, 304) or status < 200:
            self.length_remaining = 0
            self._done = True
            return
        framing = head.transfer_encoding
        if framing is not None:
            if framing.lower().rsplit(",", 1)[-1].strip() != "chunked":
                self._keep_alive = False  # only a close delimits a non-chunked coding
            else:
                self._chunked = True
            return
        length = head.content_length
        if length is None:
            self._keep_alive = False  # read until the upstream closes
            return
        try:
            value = int(length)
        except ValueError:
            raise UpstreamProtocolError("bad Content-Length") from None
        if value < 0:
            raise UpstreamProtocolError("bad Content-Length")
        self.length_remaining = value
        self._done = value == 0

    def header(self, name: str) -> str | None:
        """The first value of the field ``name`` (lower case), or ``None``."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def complete(self) -> bool:
        return self._done

    def read1(self, amt: int = _RECV) -> bytes:
        """Up to ``amt`` body bytes as soon as any arrive; ``b""`` at the end."""
        conn = self._conn
        if self._done or conn is None:
            return b""
        if self._chunked:
            return self._read1_chunked(conn, amt)
        if self.length_remaining is None:
            if not conn.buf and not conn.fill(amt):
                self._done = True
                return b""
            piece, conn.buf = conn.buf[:amt], conn.buf[amt:]
            return piece
        piece = conn.take(min(amt, self.length_remaining))
        self.length_remaining -= len(piece)
        if not self.length_remaining:
            self._done = True
        return piece

    def _read1_chunked(self, conn: _Conn, amt: int) -> bytes:
        if not self._chunk_left:
            size_line = conn.line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise UpstreamProtocolError("bad chunk size") from None
            if size < 0:
                raise UpstreamProtocolError("bad chunk size")
            if size == 0:
                while conn.line():  # trailers are hop-by-hop for us: dropped
                    pass
                self._done = True
                return b""
            self._chunk_left = size
        piece = conn.take(min(amt, self._chunk_left))
        self._chunk_left -= len(piece)
        if not self._chunk_left and conn.line():
            raise UpstreamProtocolError("chunk not followed by CRLF")
        return piece

    def read(self) -> bytes:
        """The whole remaining body (callers bound it by ``length_remaining``)."""
        first = self.read1(_RECV)
        if self._done or not first:
            return first  # the usual small answer: one piece, no list to join
        pieces = [first]
        while True:
            piece = self.read1(_RECV)
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def release_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep_alive and not conn.buf:
            self._transport._put(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def interrupt(self) -> None:
        """Wake a reader blocked on this response (from another thread): its read ends.

        ``shutdown`` rather than ``close``: closing a descriptor another thread is
        blocked on does not wake it on Linux, and the number could be reused.
        """
        conn = self._conn
        if conn is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def detach(self) -> tuple[socket.socket, bytes]:
        """Take the socket of a ``101`` answer and the bytes already read past its head.

        The caller owns (and must close) the socket; this response is done.
        """
        conn, self._conn = self._conn, None
        if conn is None or self.status != 101:
            raise UpstreamProtocolError("only a 101 answer's connection can be detached")
        if conn.kernel_timeouts:
            # Hand over an ordinary Python socket: the kernel's timeouts off, Python's on.
            timeout = conn.timeout
            conn.set_timeout(None)
            conn.sock.settimeout(timeout)
        return conn.sock, conn.buf


class PooledTransport:
    """Keep-alive connections to upstreams, with failover, TLS and timeouts.

    :param connect_timeout: seconds to establish a connection (TCP and TLS).
    :param read_timeout: seconds of silence tolerated until the response
        headers arrive, and within bodies that have a ``Content-Length``.
    :param stream_idle_timeout: seconds of silence tolerated within a response
        body without ``Content-Length`` (watches); ``None`` waits forever.
    :param pool_maxsize: idle connections kept per upstream identity; more are
        opened under load but closed instead of kept.
    :param failure_cooldown: seconds an address that failed to connect is
        skipped while other addresses remain.
    :param address_policy: where connections may go, checked on every resolved
        address (:mod:`bcs_middleware.upstream.addresses`); default the built-in
        refusals (link-local, multicast, ... and this process's listeners).

    ``connections_opened`` counts every upstream connection established, so
    tests and benchmarks can check keep-alive works (connections per request).
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        stream_idle_timeout: float | None = 3600.0,
        pool_maxsize: int = 32,
        failure_cooldown: float = 10.0,
        address_policy: AddressPolicy | None = None,
    ) -> None:
        self.address_policy = address_policy or DEFAULT_POLICY
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.pool_maxsize = pool_maxsize
        self.failure_cooldown = failure_cooldown
        self._lock = threading.Lock()
        self._idle: dict[_PoolKey, list[_Conn]] = {}
        self._contexts: dict[_PoolKey, ssl.SSLContext] = {}
        self._origins: dict[str, tuple[str, str, int, str, str]] = {}
        self._failed: dict[str, float] = {}
        self._warned_unverified: set[str] = set()
        self._opened = 0

    @property
    def connections_opened(self) -> int:
        """Upstream connections established so far by this transport."""
        return self._opened

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
    ) -> UpstreamResponse:
        """Send one request, failing over across ``upstream.base_urls``.

        :param headers: the final header list (hop-by-hop and credentials
            already handled by the caller); ``Host`` and framing are set here.
        :param body: ``None`` for no body, else an iterable of byte chunks,
            consumed once.
        :param content_length: the exact body length, or ``None`` to send a
            body chunked.
        :raises BCSError: :class:`BadGateway` or :class:`GatewayTimeout`.
        """
        return self._send(upstream, method, headers, body, content_length, upgrade=False)

    def open_upgrade(
        self, upstream: Upstream, method: str, headers: list[tuple[str, str]]
    ) -> UpstreamResponse:
        """Send a body-less connection-upgrade request on a **fresh** connection.

        The connection never comes from the pool and never goes back to it,
        whatever the answer: after an upgrade the bytes on it are another
        protocol, and after a refused upgrade it is closed so nothing the
        client sends later can ride on it (CVE-2018-1002105). Failover,
        timeouts, TLS and error translation are those of :meth:`send`.

        :param headers: as for :meth:`send`, including ``Connection`` and
            ``Upgrade``.
        :returns: the response head; on ``101`` take the socket with
            :meth:`UpstreamResponse.detach`, otherwise read the body as usual
            (the connection closes when it is released).
        """
        return self._send(upstream, method, headers, None, None, upgrade=True)

    def _send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
        *,
        upgrade: bool,
    ) -> UpstreamResponse:
        target = upstream.path or "/"
        if upstream.query:
            target = f"{target}?{upstream.query}"
        tail = "".join([f"{name}: {value}\r\n" for name, value in headers])
        # One count over the joined head instead of two tests per field: a line break
        # inside a name or value would start a header (or a request) of its own.
        if tail.count("\n") != len(headers) or tail.count("\r") != len(headers):
            bad = next(name for name, value in headers if "\n" in name + value or "\r" in name + value)
            raise BadRequest(f"header {bad} contains a line break")
        if content_length is not None:
            tail = f"{tail}Content-Length: {content_length}\r\n\r\n"
        elif body is not None:
            tail = f"{tail}Transfer-Encoding: chunked\r\n\r\n"
        else:
            tail += "\r\n"

        candidates = self._candidates(upstream.base_urls)
        if not candidates:
            raise BadGateway(f"upstream {upstream.name or '?'} has no address")
        last_error: BCSError | None = None
        replayable = body is None and method in _REPLAYABLE and not upgrade
        for base in candidates:
            scheme, host, port, prefix, host_header = self._origin(base)
            label = upstream.name or host
            key = _PoolKey(
                scheme, host, port,
                *((upstream.ca_pem, upstream.server_name, upstream.verify, upstream.client_cert)
                  if scheme == "https" else (None, None, True, None)),
            )
            head = f"{method} {prefix}{target} HTTP/1.1\r\nHost: {host_header}\r\n{tail}"
            for _attempt in range(2):
                conn = None if upgrade else self._get(key)
                if conn is None:
                    try:
                        conn = self._connect(key, label)
                    except BCSError as exc:
                        if exc.code_name == "UPSTREAM_TLS_ERROR":
                            raise
                        self._failed[base] = time.monotonic()
                        last_error = exc
                        break  # next address: nothing was sent
                try:
                    return self._exchange(conn, method, head, body, content_length, upgrade)
                except OSError as exc:  # UpstreamProtocolError and timeouts included
                    conn.close()
                    if conn.reused and replayable and not isinstance(exc, TimeoutError):
                        # The upstream closed idle connections (a restart, its
                        # keep-alive timeout): drop the rest, retry on a fresh one.
                        self._drop_idle(key)
                        continue
                    raise self._translate(exc, label, host) from None
                except BaseException:
                    conn.close()  # e.g. the client's body broke off: never reuse
                    raise
            else:
                raise BadGateway(f"upstream {label}: {host} keeps closing connections")
        assert last_error is not None
        raise last_error

    def _exchange(self, conn: _Conn, method: str, head: str, body: Body,
                  content_length: int | None, upgrade: bool = False) -> UpstreamResponse:
        conn.set_timeout(self.read_timeout)
        conn.sendall(head.encode("latin-1"))
        if body is not None:
            chunked = content_length is None
            for piece in body:
                if not piece:
                    continue
                if chunked:
                    conn.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                else:
                    conn.sendall(piece)
            if chunked:
                conn.sendall(b"0\r\n\r\n")
        while True:
            answer = self._read_head(conn)
            if answer.status >= 200 or answer.status == 101:
                break  # skip 100 Continue, 103 Early Hints
        # An upgrade's connection is never pooled, refused or not.
        resp = UpstreamResponse(self, conn, method, answer, reusable=not upgrade)
        if upgrade and answer.status == 101:
            return resp  # the caller detaches the socket; nothing to release
        if resp.length_remaining is None:
            conn.set_timeout(self.stream_idle_timeout)
        elif resp.complete:
            resp.release_conn()
        return resp

    @staticmethod
    def _read_head(conn: _Conn) -> _Head:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(conn.buf) > _MAX_HEAD:
                raise UpstreamProtocolError("response head too large")
            if not conn.fill():
                raise UpstreamProtocolError("connection closed before the response")
        raw, conn.buf = conn.buf[:end], conn.buf[end + 4:]
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise UpstreamProtocolError("malformed status line")
        # One pass: every field for the caller, the relayable ones for a proxy, and
        # the framing fields.
        headers = []
        end_to_end = []
        connection = framing = length = None
        for line in lines[1:]:
            field, kind = _field(line) if len(line) <= _CACHED_LINE else _parse_field(line)
            headers.append(field)
            if kind == _END_TO_END:
                end_to_end.append(field)
            elif kind == _CONTENT_LENGTH:
                if length is not None and length != field[1]:
                    # Two different lengths: where the body ends is anyone's guess.
                    raise UpstreamProtocolError("conflicting Content-Length")
                length = field[1]
                end_to_end.append(field)
            elif kind == _CONNECTION:
                connection = f"{connection}, {field[1]}" if connection else field[1]
            elif kind == _TRANSFER_ENCODING:
                framing = f"{framing}, {field[1]}" if framing else field[1]
        keep_alive = parts[0] == "HTTP/1.1"
        if connection:
            options = connection_tokens(connection)
            keep_alive = keep_alive and "close" not in options
            named = named_by_connection(connection)
            if named:
                end_to_end = [f for f in end_to_end if f[0].lower() not in named]
        return _Head(int(parts[1]), parts[2] if len(parts) > 2 else "", headers, end_to_end,
                     framing, length, keep_alive)

    def _get(self, key: _PoolKey) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                return None
            # A readable idle socket means the upstream closed it (or sent
            # garbage): either way it cannot carry our request. Checked only
            # after a pause: every syscall releases the GIL, and under load a
            # hot connection was in use a moment ago (a stale one is still
            # caught by the retry of replayable requests).
            sock = conn.sock
            if time.monotonic() - conn.idle_since > _CHECK_AFTER_IDLE and (
                (isinstance(sock, ssl.SSLSocket) and sock.pending())
                or select.select([sock], [], [], 0)[0]
            ):
                conn.close()
                continue
            conn.reused = True
            return conn
        return None

    def _drop_idle(self, key: _PoolKey) -> None:
        for conn in self._idle.pop(key, []):
            conn.close()

    def _put(self, conn: _Conn) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:
            with self._lock:
                idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.pool_maxsize:
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()

    def _connect(self, key: _PoolKey, label: str) -> _Conn:
        try:
            # The address policy resolves and checks every address, and connects only to an
            # allowed one (AddressRefused, a BCSError, passes through to the failover).
            sock = self.address_policy.connect(key.host, key.port, self.connect_timeout, label=label)
        except TimeoutError:
            raise GatewayTimeout(f"upstream {label}: connecting to {key.host} timed out") from None
        except OSError:
            raise BadGateway(
                f"upstream {label}: cannot connect to {key.host} (connection refused or "
                "unreachable)"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if key.scheme == "https":
            try:
                sock = self._context(key, label).wrap_socket(
                    sock, server_hostname=key.server_name or key.host
                )
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                reason = exc.verify_message or "certificate verify failed"
                raise BadGateway(
                    f"upstream {label}: the TLS certificate of {key.host} did not verify "
                    f"({reason})",
                    code_name="UPSTREAM_TLS_ERROR",
                ) from None
            except TimeoutError:
                sock.close()
                raise GatewayTimeout(
                    f"upstream {label}: TLS handshake with {key.host} timed out"
                ) from None
            except (ssl.SSLError, OSError):
                sock.close()
                raise BadGateway(
                    f"upstream {label}: TLS handshake with {key.host} failed",
                    code_name="UPSTREAM_TLS_ERROR",
                ) from None
        with self._lock:
            self._opened += 1
        return _Conn(sock, key)

    def _context(self, key: _PoolKey, label: str) -> ssl.SSLContext:
        ctx = self._contexts.get(key)
        if ctx is not None:
            return ctx
        ctx = ssl.create_default_context(cadata=key.ca_pem) if key.ca_pem else (
            ssl.create_default_context()
        )
        if not key.verify:
            if label not in self._warned_unverified:
                self._warned_unverified.add(label)
                log.warning(
                    "TLS verification is OFF for upstream %s (explicitly configured); "
                    "its identity is not checked", label,
                )
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if key.client_cert:
            ctx.load_cert_chain(*key.client_cert)
        self._contexts[key] = ctx
        return ctx

    def _candidates(self, base_urls: tuple[str, ...]) -> list[str]:
        if not self._failed:
            return list(base_urls)
        now = time.monotonic()
        fresh = [
            base for base in base_urls
            if now - self._failed.get(base, -self.failure_cooldown) >= self.failure_cooldown
        ]
        return fresh or list(base_urls)

    def _origin(self, base: str) -> tuple[str, str, int, str, str]:
        origin = self._origins.get(base)
        if origin is None:
            parts = urlsplit(base)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https") or not parts.hostname:
                raise BadGateway("upstream address is not an http(s) URL")
            default = 443 if scheme == "https" else 80
            port = parts.port or default
            host = parts.hostname
            shown = f"[{host}]" if ":" in host else host
            host_header = shown if port == default else f"{shown}:{port}"
            origin = (scheme, host, port, parts.path.rstrip("/"), host_header)
            self._origins[base] = origin
        return origin

    @staticmethod
    def _translate(exc: BaseException, label: str, host: str) -> BCSError:
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"upstream {label}: no response from {host} in time")
        if isinstance(exc, UpstreamProtocolError):
            return BadGateway(f"upstream {label}: {host} sent a malformed answer or closed "
                              "the connection")
        return BadGateway(f"upstream {label}: {host} closed or reset the connection")

    def close(self) -> None:
        """Close every idle connection; the transport stays usable."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def reset(self) -> None:
        """Forget connections inherited from a parent process (call in ``post_fork``).

        Their sockets belong to the parent; they are dropped, not shut down.
        """
        self._idle = {}
        self._contexts = {}
        self._failed = {}
        self._lock = threading.Lock()
