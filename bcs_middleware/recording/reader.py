"""The recording store as ``/rest/sessions`` reads it: every call on operating-system threads.

A listing reads every session's record and a download reads a file; against a store that hangs
in the kernel (an NFS server gone, a full FUSE mount) either would stop the whole gevent worker,
as a write would (:mod:`.recorder` moved those off the event loop the same way). Each call here
runs on a small pool of its own (:class:`~bcs_middleware.core.offload.Offload`: bounded threads
and outstanding calls) and is waited for at most ``timeout``: past it the caller gets ``503`` and
the worker's other requests never noticed. A download already under way that stalls is cut (its
status has been sent): the client sees a truncated file, not a hung one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..core.errors import ServiceUnavailable
from ..core.offload import Offload, OffloadBusy, OffloadTimeout
from .catalog import RecordingStore, SessionInfo, SessionQuery

__all__ = ["RecordingStoreUnavailable", "StoreReader"]

T = TypeVar("T")

#: Threads and outstanding calls of one worker's reads (a hung store holds them; more are refused).
READ_THREADS = 2
READ_PENDING = 8


class RecordingStoreUnavailable(ServiceUnavailable):
    code_name = "RECORDING_STORE_UNAVAILABLE"


class StoreReader:
    """``sessions``, ``get`` and ``read`` of ``store``, each call at most ``timeout`` seconds.

    :param store: the recording store.
    :param timeout: seconds one call into the store may take (the recorder's stall timeout).
    """

    def __init__(self, store: RecordingStore, *, timeout: float) -> None:
        self.store = store
        self.timeout = timeout
        self._offload = Offload(threads=READ_THREADS, pending=READ_PENDING, name="bcs-recording-read")

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return self._offload.call(fn, *args, timeout=self.timeout)
        except OffloadTimeout:
            raise RecordingStoreUnavailable(
                f"the recording store did not answer within {self.timeout:g}s") from None
        except OffloadBusy:
            raise RecordingStoreUnavailable("the recording store is not answering (its threads are all held)") \
                from None

    def sessions(self, query: SessionQuery) -> list[SessionInfo]:
        return self._call(self.store.sessions, query)

    def get(self, session_id: str) -> SessionInfo | None:
        return self._call(self.store.get, session_id)

    def read(self, session_id: str) -> Iterator[bytes]:
        """The file's pieces; opened here (``OSError`` when it cannot be), each piece read on a
        pool thread. A piece that does not come within the timeout ends the download with
        ``OSError`` (the server then closes the connection)."""
        pieces = self._call(lambda: iter(self.store.read(session_id)))
        return self._pieces(pieces)

    def _pieces(self, pieces: Iterator[bytes]) -> Iterator[bytes]:
        try:
            while True:
                try:
                    piece = self._call(next, pieces, None)
                except RecordingStoreUnavailable as exc:
                    raise OSError(exc.message) from None
                if piece is None:
                    return
                yield piece
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                try:
                    self._call(close)
                except RecordingStoreUnavailable:
                    pass  # its thread is held by the hung read; the file is closed when it returns
