"""Renewal while serving, and the one server TLS context that notices new certificate files.

:class:`CertificateRenewer` runs :func:`~.files.ensure_gateway_pki` periodically (in the
gunicorn master); :class:`ServerContext` is what every worker — gthread through gunicorn's
``ssl_context`` hook (:func:`gunicorn_ssl_context`), the gateway's gevent worker directly —
wraps new connections with, and it reloads the files when they change: a renewed
certificate is served from the next connection on, without a restart.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from .files import GatewayPKI, ensure_gateway_pki

log = logging.getLogger(__name__)


class CertificateRenewer:
    """Check the embedded gateway's certificate every ``interval`` seconds while it serves.

    :func:`ensure_gateway_pki` renews the server certificate ``renew_before`` its
    expiry (certifying the same key again, one atomic file replace). gunicorn's
    workers take every new connection's context from :class:`ServerContext` (``serve``'s
    ``ssl_context`` hook; the gateway's gevent worker asks it again when the files change,
    :mod:`bcs_middleware.serving.gevent_worker`), which reloads the files when they changed, so the
    renewed certificate is served from the next connection on: a gateway that
    runs for longer than a certificate lives needs no restart. Run it in one process
    (the gunicorn master); a failed check is logged and retried at the next interval.
    """

    def __init__(self, data_dir: Path, hosts: Sequence[str], *, interval: float,
                 renew_before: timedelta = timedelta(days=30)) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive (got {interval})")
        self.data_dir = Path(data_dir)
        self.hosts = list(hosts)
        self.interval = interval
        self.renew_before = renew_before
        self._thread: threading.Thread | None = None

    def check(self) -> GatewayPKI | None:
        """One check (and renewal when due); ``None`` when it failed (logged)."""
        try:
            pki = ensure_gateway_pki(self.data_dir, self.hosts, renew_before=self.renew_before)
        except Exception as exc:  # the server keeps serving its current certificate
            log.warning("checking the gateway certificate failed (%s); retrying in %.0f s",
                        type(exc).__name__, self.interval)
            return None
        if pki.issued_cert:
            log.info("renewed the gateway certificate %s (%s); new connections get it",
                     pki.cert_file, pki.reason)
        return pki

    def start(self) -> None:
        """Check every ``interval`` from now on, on a daemon thread (it ends with the process)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bcs-cert-renewer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.check()


def _file_version(path: str | None) -> int:
    if not path:
        return 0
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


class ServerContext:
    """The server side's TLS context, rebuilt when the certificate files change.

    gunicorn's gthread worker asks for a context on every new connection and its default
    factory parses the certificate chain and key each time; the gevent worker asks once
    and keeps it for the worker's life. Both only call ``wrap_socket`` on it, so this
    object builds one ``SSLContext`` per version (modification times) of the files and
    hands each connection to the current one: a connection costs the handshake only, TLS
    sessions can be resumed (tickets are per context), and a renewed certificate (see
    :class:`CertificateRenewer`) is served from the next connection on under either worker.
    """

    def __init__(self, conf: Any, factory: Callable[[], ssl.SSLContext], *,
                 first: ssl.SSLContext | None = None) -> None:
        self._conf = conf
        self._factory = factory
        self._current: tuple[tuple[int, ...], ssl.SSLContext] | None = None
        self._socket_class: type[ssl.SSLSocket] | None = None
        if first is not None:
            self._current = (self._version(), first)

    def use_socket_class(self, socket_class: type[Any]) -> None:
        """Make every connection from now on a ``socket_class`` (the context's public
        ``sslsocket_class``), in the current context and in every one rebuilt later."""
        self._socket_class = socket_class
        if self._current is not None:
            self._apply_socket_class(self._current[1])

    def _apply_socket_class(self, context: ssl.SSLContext) -> None:
        # Only a subclass of the socket this context makes (gevent's context makes gevent's
        # sockets; a context built before gevent patched the process makes the stdlib's).
        chosen = self._socket_class
        if chosen is not None and issubclass(chosen, type(context).sslsocket_class):
            context.sslsocket_class = chosen

    def _version(self) -> tuple[int, ...]:
        conf = self._conf
        return _file_version(conf.certfile), _file_version(conf.keyfile), _file_version(conf.ca_certs)

    def context(self) -> ssl.SSLContext:
        version = self._version()
        current = self._current
        if current is None or current[0] != version:
            try:
                built = self._factory()
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                if current is None:
                    raise
                # Caught between the key and the certificate being replaced (a hand edit; the
                # renewer replaces one file atomically): the current context serves on, and the
                # next connection tries again.
                log.warning("reloading the TLS certificate failed (%s); retrying", type(exc).__name__)
                return current[1]
            self._apply_socket_class(built)
            # Two threads may build it at once after a change; either result is right.
            current = self._current = (version, built)
        return current[1]

    def wrap_socket(self, sock: socket.socket, **kwargs: Any) -> ssl.SSLSocket:
        return self.context().wrap_socket(sock, **kwargs)


_server_context: ServerContext | None = None


def gunicorn_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ServerContext:
    """gunicorn's ``ssl_context`` server hook: this process's :class:`ServerContext`."""
    global _server_context
    if _server_context is None:
        _server_context = ServerContext(conf, default_ssl_context_factory)
    return _server_context


def reloading_context(conf: Any, build: Callable[[], Any]) -> ServerContext:
    """The :class:`ServerContext` for a worker that builds its context itself (the gevent worker).

    :param build: gunicorn's ``ssl_context(conf)``: the ``ssl_context`` hook's answer, which is
        this process's :class:`ServerContext` under ``serve`` (:func:`gunicorn_ssl_context`),
        or an ``SSLContext`` from another hook or gunicorn's default — then wrapped here, so it
        is rebuilt (by the same hook) when the files change.
    """
    first = build()
    if isinstance(first, ServerContext):
        return first
    return ServerContext(conf, build, first=first)
