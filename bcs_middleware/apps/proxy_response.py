"""The upstream's answer relayed to the client: a small body at once, any other streamed.

A sized body up to :data:`_PRELOAD_LIMIT` is read before the status line goes out; any other
streams piece by piece as it arrives (:class:`_StreamedBody`), watching the client socket
(:mod:`~bcs_middleware.apps.departure`) so a client that leaves a quiet watch ends it at once.
:func:`end_streams` ends every open stream of the process for a graceful shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..core import environ as env
from ..outbound.causes import OutboundError
from ..outbound.transport import Response
from ..telemetry import metrics
from . import departure
from . import upgrade as upg
from .proxy_failure import unreachable

# The proxy's logger, whichever of its modules writes: operators filter on this one name.
log = logging.getLogger("bcs_middleware.apps.proxy")

# The most read from the upstream at once (read1 may return less: whatever has arrived).
_PIECE = 64 * 1024
# Bodies up to this size are read before the status line goes out, so an
# upstream failing mid-body still becomes a clean 502 and the connection is
# back in the pool before the client has even seen the answer.
_PRELOAD_LIMIT = 64 * 1024


def relay(
    environ: dict[str, Any], start_response: Any, resp: Response, upstream: env.Upstream
) -> Iterable[bytes]:
    """Start the client's response with the upstream's status and end-to-end headers, and return its body."""
    # The transport has dropped the hop-by-hop fields (and those Connection names).
    out_headers = resp.end_to_end_headers
    remaining = resp.length_remaining
    if remaining is not None and remaining <= _PRELOAD_LIMIT:
        try:
            data = resp.read()
        except OutboundError as broken:  # broke off, stalled or broke the framing
            resp.close()
            resp.release_conn()
            return unreachable(environ, upstream, broken)(environ, start_response)
        resp.release_conn()
        start_response(f"{resp.status} {resp.reason}", out_headers)
        return [data]
    start_response(f"{resp.status} {resp.reason}", out_headers)
    return _StreamedBody(resp, upstream.name, upg.client_socket(environ))


class _UpstreamBrokeOff(Exception):
    """Raised into the server so it aborts the client connection instead of ending it cleanly."""


_open_streams: set[_StreamedBody] = set()
_open_lock = threading.Lock()


def end_streams() -> int:
    """End every open streamed response of this process cleanly; returns how many.

    For a graceful shutdown (SIGTERM): a watch or ``logs -f`` would otherwise run
    until the server's graceful timeout and then be cut. Ending it sends the final
    chunk, so the client sees a finished response (kubectl simply re-watches,
    against another instance). Sized responses are left to finish on their own.
    """
    # No lock: this runs in a SIGTERM handler, which may interrupt a holder of _open_lock
    # (itself, on a second SIGTERM) and must never wait (under gevent it runs in the hub,
    # where waiting raises). tuple() copies the set in one step under the GIL.
    streams = [s for s in tuple(_open_streams) if s.endable]
    for stream in streams:
        stream.end()
    return len(streams)


class _StreamedBody:
    """The response body, relayed piece by piece; ``close()`` frees the upstream connection.

    While it streams, the client socket (when the server hands it over) is watched
    (:mod:`~bcs_middleware.apps.departure`): a client that leaves during a quiet
    watch ends the stream at once instead of at the next event or the idle timeout.
    """

    def __init__(self, resp: Response, label: str, client: Any = None) -> None:
        self._resp = resp
        self._label = label
        self._client = client
        self._watch: departure.Watch | None = None
        self._complete = False
        self._closed = False
        self._ending = False
        self._departed = False
        # Only a body without a length can end early and still look complete to the client.
        self.endable = resp.length_remaining is None
        with _open_lock:
            _open_streams.add(self)
        metrics.OPEN_STREAMS.inc()

    def end(self) -> None:
        self._ending = True
        self._interrupt()

    def _interrupt(self) -> None:
        interrupt = getattr(self._resp, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def _client_left(self) -> None:
        self._departed = True
        metrics.STREAMS_DEPARTED.inc()
        self._interrupt()

    def __iter__(self) -> Iterator[bytes]:
        # An empty first piece makes the server send the status line and headers
        # now: a quiet watch must still tell its client the request was accepted.
        yield b""
        read1 = self._resp.read1
        if self._client is not None and not self._closed:
            try:
                self._watch = departure.watch(self._client, self._client_left)
            except (OSError, ValueError):  # the client is already gone (a closed descriptor)
                self._departed = True
                return
        try:
            while True:
                # read1 returns what has arrived (up to one chunk) instead of
                # waiting to fill the buffer: each watch event goes out at once.
                piece = read1(_PIECE)
                if not piece:
                    break
                yield piece
        except OutboundError as cause:
            if self._ending or self._departed:
                # Shutting down: end the response cleanly (the connection is not reused).
                # The client left: nobody reads what follows.
                return
            metrics.UPSTREAM_ERRORS.labels(metrics.upstream_label(self._label or "?"), cause.label).inc()
            log.info("upstream %s: response body broke off (%s)", self._label, cause.label)
            # Ending normally would send the last chunk and make a truncated
            # body look complete; an exception makes the server drop the client.
            raise _UpstreamBrokeOff(f"upstream {self._label} broke off its answer") from None
        finally:
            self._stop_watching()
        self._complete = True
        # Pooled now, not in close(): the server writes the last chunk between the two, and a
        # client that sends its next request at once must find the connection in the pool.
        self._resp.release_conn()

    def _stop_watching(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_watching()
        with _open_lock:
            _open_streams.discard(self)
        metrics.OPEN_STREAMS.dec()
        if not self._complete or self._ending or self._departed:
            # Half-read: the connection is mid-message and must never be reused.
            self._resp.close()
        self._resp.release_conn()
