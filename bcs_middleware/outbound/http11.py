"""One HTTP/1.1 exchange on a connection: all the framing, on top of the strict codec.

:func:`exchange` writes the request head (built by :func:`~.codec.request_head`) and the
body — as it is when its length is known, else in chunks (RFC 9112 §7.1) — and reads
the answer's head (:class:`~.codec.ResponseReader`: llhttp, every malformed or ambiguous
frame refused). :class:`UpstreamResponse` reads the body on demand, raw, and decides
whether the connection may be reused: only after a complete, well framed answer that
allows keep-alive, with nothing after it. A ``101``'s connection is detached for the
caller (:meth:`UpstreamResponse.detach`).

Timeouts: ``read_timeout`` between bytes until the head arrives and within bodies that
have a ``Content-Length``; a body *without* one (a watch, a log follow) switches to
``stream_timeout`` once the head is in, because such streams may legitimately stay
quiet for long. Failures of the body leave as causes (:mod:`.causes`, stage ``body``);
those of the request and head as the foreign exception, which the pool translates
(it first decides whether the request may be replayed).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from .causes import FOREIGN, translate
from .codec import ResponseReader
from .streams import RECV, Connection

Body = Iterable[bytes] | None


def exchange(conn: Connection, label: str, method: str, head: bytes, body: Body, content_length: int | None, *,
             upgrade: bool, read_timeout: float | None, stream_timeout: float | None,
             keep: Callable[[Connection], None]) -> UpstreamResponse:
    """Send the request on ``conn`` and read the answer's head.

    :param keep: takes the connection back once its answer was fully read, if reusable.
    :raises: the foreign exception (``OSError``, a codec error) for the caller to translate.
    """
    conn.set_timeout(read_timeout)
    conn.write(head)
    if body is not None:
        _send_body(conn, body, chunked=content_length is None)
    reader = ResponseReader(head_request=method == "HEAD", upgrade_requested=upgrade)
    try:
        while not reader.head_complete:
            data = conn.read(RECV)
            if data:
                reader.feed(data)
            else:
                reader.end_of_input()
    except BaseException:
        reader.release()
        raise
    # An upgrade's connection is never pooled, refused or not.
    resp = UpstreamResponse(conn, reader, label, keep, reusable=not upgrade)
    if reader.status == 101:
        return resp  # the caller detaches the socket; nothing to release
    if resp.length_remaining is None:
        conn.set_timeout(stream_timeout)
    elif resp.complete:
        resp.release_conn()
    return resp


def _send_body(conn: Connection, body: Iterable[bytes], *, chunked: bool) -> None:
    for piece in body:
        if not piece:
            continue  # an empty chunk would end a chunked body
        if chunked:
            conn.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        else:
            conn.write(piece)
    if chunked:
        conn.write(b"0\r\n\r\n")


class UpstreamResponse:
    """An upstream answer whose body is read on demand, raw.

    ``read1``/``read`` raise an :class:`~.causes.OutboundError` when the upstream breaks
    off, stalls or breaks the framing. ``release_conn()`` returns a fully read
    keep-alive connection to its pool and closes any other; ``close()`` abandons the
    body and the connection.
    """

    def __init__(self, conn: Connection, reader: ResponseReader, label: str,
                 keep: Callable[[Connection], None], reusable: bool = True) -> None:
        self.status = reader.status
        self.reason = reader.reason
        self.headers = reader.headers
        self.end_to_end_headers = reader.end_to_end
        self.length_remaining: int | None = reader.length
        self._keep = keep
        self._conn: Connection | None = conn
        self._reader = reader
        self._label = label
        self._reusable = reusable and reader.keep_alive

    def header(self, name: str) -> str | None:
        """The first value of the field ``name`` (lower case), or ``None``."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def complete(self) -> bool:
        """The whole body has been read."""
        return self._reader.complete and not self._reader.pieces

    def read1(self, amt: int = RECV) -> bytes:
        """Up to ``amt`` body bytes as soon as any arrive; ``b""`` at the end."""
        reader = self._reader
        pieces = reader.pieces
        if not pieces:
            conn = self._conn
            if reader.complete or conn is None:
                return b""
            try:
                while not pieces and not reader.complete:
                    data = conn.read(RECV)
                    if data:
                        reader.feed(data)
                    else:
                        reader.end_of_input()
            except FOREIGN as exc:
                raise translate(exc, "body", self._label, conn.key.host) from None
            if not pieces:
                return b""
        piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        if len(piece) > amt:
            pieces.append(piece[amt:])
            piece = piece[:amt]
        if self.length_remaining is not None:
            self.length_remaining -= len(piece)
        return piece

    def read(self) -> bytes:
        """The whole remaining body (callers bound it by ``length_remaining``)."""
        first = self.read1(RECV)
        if not first or self.complete:
            return first  # the usual small answer: one piece, no list to join
        pieces = [first]
        while True:
            piece = self.read1(RECV)
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def release_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reader = self._reader
        reader.release()
        if reader.complete and not reader.pieces and reader.reusable and self._reusable:
            self._keep(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._reader.release()
        if conn is not None:
            conn.close()

    def interrupt(self) -> None:
        """Wake a reader blocked on this response (from another thread): its read ends."""
        conn = self._conn
        if conn is not None:
            conn.interrupt()

    def detach(self) -> tuple[socket.socket, bytes]:
        """Take the socket of a ``101`` answer and the bytes already read past its head.

        The caller owns (and must close) the socket; this response is done.
        """
        conn, self._conn = self._conn, None
        if conn is None or self.status != 101:
            raise RuntimeError("only a 101 answer's connection can be detached")
        return conn.take_socket(), self._reader.leftover
