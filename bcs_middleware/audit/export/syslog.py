"""The syslog backend: each event an RFC 5424 message, over TCP (RFC 6587) or TLS (RFC 5425).

A message::

    <110>1 2026-11-28T05:40:01.123456Z gw-1 bcs-middleware 4242 audit [meta sequenceId="17"] {"kind":"Event",...}

* ``PRI`` = facility * 8 + severity: facility 13 (*log audit*, RFC 5424 §6.2.1), severity 6
  (*informational*) — 110;
* ``TIMESTAMP`` the event's ``stageTimestamp`` (when it happened, not when it was sent: a
  message delivered after an outage keeps its time), ``HOSTNAME`` this host's name,
  ``APP-NAME`` ``bcs-middleware``, ``PROCID`` the writing process, ``MSGID`` ``audit``;
* ``[meta sequenceId]`` (RFC 5424 §7.3.1) numbers the messages of one spool (1 …
  2147483647, then 1 again), so a receiver can see a gap or a repeat;
* ``MSG`` the event's JSON, UTF-8 (``MSG-ANY``, no BOM: a SIEM parses it as JSON).

Framing is octet-counting (RFC 6587 §3.4.1, required by RFC 5425 §4.3): ``LENGTH SP MESSAGE``,
so a message may hold any byte. TLS verifies the receiver's certificate against the given
CA (the system's by default) and its name; a client certificate is presented when given.

**What "once" means here.** Syslog has no acknowledgement: an event counts as delivered
when its bytes were handed to the connection (``sendall`` returned). Before each write the
connection is checked: one the receiver closed (a restarted rsyslog) is replaced first, so
nothing is written into a dead connection. What cannot be seen is a receiver that dies
after the kernel accepted the bytes and before it read them: those events (at most a
socket buffer) are lost. A write that fails part-way is sent again whole on a new
connection: those events may arrive twice (``sequenceId`` tells).
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ...core.errors import ConfigError
from ...outbound.addresses import AddressPolicy
from .backend import DeliveryFailed, Outcome
from .truncate import fit

log = logging.getLogger(__name__)

__all__ = ["SyslogBackend", "SyslogTarget", "format_message", "parse_syslog_url"]

FACILITY_LOG_AUDIT = 13
SEVERITY_INFO = 6
APP_NAME = "bcs-middleware"
MSGID = "audit"
_MAX_SEQUENCE = 2147483647


@dataclass(frozen=True)
class SyslogTarget:
    """:param tls: RFC 5425 (``tls://``) rather than plain TCP (``tcp://``).
    :param ca_file: the CA the receiver's certificate chains to (``None``: the system's).
    :param server_name: the name its certificate must carry (default: ``host``).
    :param client_cert: ``(certfile, keyfile)`` to present."""

    host: str
    port: int
    tls: bool
    ca_file: str | None = None
    server_name: str | None = None
    client_cert: tuple[str, str] | None = None
    max_message_size: int = 64 * 1024


def parse_syslog_url(value: str) -> tuple[str, int, bool]:
    """``tcp://HOST:PORT`` or ``tls://HOST:PORT`` → (host, port, tls); ConfigError otherwise."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"audit syslog {value!r}: expected tcp://HOST:PORT or tls://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not port:
        raise ConfigError(f"audit syslog {value!r}: a port is needed (RFC 5425's is 6514)")
    return parts.hostname, port, parts.scheme == "tls"


def format_message(record: bytes, sequence: int, *, hostname: str, procid: str) -> bytes:
    """The RFC 5424 message of one event's JSON (see the module docs)."""
    try:
        timestamp = str(json.loads(record).get("stageTimestamp") or "-")
    except (ValueError, AttributeError):
        timestamp = "-"
    pri = FACILITY_LOG_AUDIT * 8 + SEVERITY_INFO
    head = f'<{pri}>1 {timestamp} {hostname} {APP_NAME} {procid} {MSGID} [meta sequenceId="{sequence}"] '
    return head.encode("ascii", "replace") + record


def _header_field(value: str, limit: int) -> str:
    """A header field as RFC 5424 §6 allows: printable US-ASCII, no space, at most ``limit``."""
    cleaned = "".join(c for c in value if 33 <= ord(c) <= 126)[:limit]
    return cleaned or "-"


class SyslogBackend:
    """Send events to a syslog receiver (see the module docs).

    :param target: the receiver.
    :param address_policy: where connections may go (the gateway's upstream policy).
    :param connect_timeout: seconds to connect (TCP and TLS).
    :param write_timeout: seconds a write may stall.
    """

    name = "syslog"

    def __init__(self, target: SyslogTarget, *, address_policy: AddressPolicy | None = None,
                 connect_timeout: float = 5.0, write_timeout: float = 30.0) -> None:
        self.target = target
        self.address_policy = address_policy or AddressPolicy()
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self.hostname = _header_field(socket.gethostname(), 255)
        self._sock: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._sequence = 0

    def _tls_context(self) -> ssl.SSLContext:
        if self._context is None:
            context = ssl.create_default_context(cafile=self.target.ca_file)
            if self.target.client_cert:
                context.load_cert_chain(*self.target.client_cert)
            self._context = context
        return self._context

    def _connection(self) -> socket.socket:
        if self._sock is not None and _closed_by_peer(self._sock):
            log.info("audit syslog: the receiver closed the connection; connecting again")
            self._close()
        if self._sock is None:
            target = self.target
            try:
                sock = self.address_policy.connect(target.host, target.port, self.connect_timeout,
                                                   label="audit syslog")
                if target.tls:
                    sock = self._tls_context().wrap_socket(sock, server_hostname=target.server_name or target.host)
            except (OSError, ssl.SSLError) as exc:
                raise DeliveryFailed(f"audit syslog: connecting to {target.host}:{target.port}: {exc}") from None
            sock.settimeout(self.write_timeout)
            self._sock = sock
        return self._sock

    def process(self, records: Sequence[bytes]) -> Outcome:
        frames: list[bytes] = []
        dropped = 0
        procid = str(os.getpid())
        sequence = self._sequence
        for record in records:
            small = fit(record, self.target.max_message_size - 256)  # room for the header
            if small is None:
                log.warning("audit syslog: an event of %d bytes does not fit a message of at most %d bytes "
                            "even without its objects: dropped", len(record), self.target.max_message_size)
                dropped += 1
                continue
            sequence = sequence % _MAX_SEQUENCE + 1
            message = format_message(small, sequence, hostname=self.hostname, procid=procid)
            frames.append(b"%d " % len(message) + message)
        if frames:
            sock = self._connection()
            try:
                sock.sendall(b"".join(frames))
            except (OSError, ssl.SSLError) as exc:
                self._close()
                raise DeliveryFailed(f"audit syslog: writing: {exc}") from None
        self._sequence = sequence
        return Outcome(delivered=len(frames), dropped=dropped)

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def shutdown(self) -> None:
        self._close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the receiver closed (or reset) the connection: a syslog receiver never sends,
    so anything readable is its end."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
