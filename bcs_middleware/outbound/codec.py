"""HTTP/1.1 on the wire towards upstreams: the request head we write, the answers we accept.

Answers are parsed by llhttp (Node.js's parser, through ``httptools``) in its strict
mode, plus the rules a proxy needs on top. A proxy that relays a frame its client
would read differently from the upstream is a request-smuggling or response-splitting
hole, so every malformed or ambiguous answer is refused (the transport turns
:class:`UpstreamProtocolError` into a ``502`` naming the upstream) and its
connection is never reused:

* llhttp refuses: a status that is not three ASCII digits (``2000``, non-ASCII digits), a
  line ending in a bare CR or LF, a field value with a control character (NUL,
  bare LF) or an obs-fold (RFC 9112 §5.2 allows a proxy to refuse it), a
  ``Content-Length`` that is not plain digits (``+5``, ``5, 5``) or appears twice,
  even with the same value, ``Content-Length`` together with ``Transfer-Encoding``
  (RFC 9112 §6.3 lets a proxy refuse this or drop the length; refusing leaves no
  way to disagree), chunk sizes that are not plain hex (``0x5``, ``0_5``, ``5 ``),
  chunk data not followed by CRLF, and a chunk size that overflows.
* Here: a status outside 100 to 599; a version other than HTTP/1.0 and 1.1; a reason
  phrase with a control character; a ``Transfer-Encoding`` other than exactly
  ``chunked`` (``gzip, chunked`` is valid framing, but the gzip coding is hop-by-hop
  and the WSGI server re-frames the body, so relaying it would hand the client a
  compressed body with nothing saying so — and we never sent ``TE``, so the
  upstream may not use it, RFC 9112 §7.4); ``Transfer-Encoding`` in an HTTP/1.0
  answer (RFC 9112 §6.1: faulty framing); a framing field on an interim ``1xx`` or
  a ``204`` (a length of ``0`` is tolerated on a ``204``); a ``101`` to a request
  that did not ask to upgrade, or one without ``Upgrade`` and ``Connection:
  upgrade``; a head larger than 256 KiB, interim answers included.

Accepted and handled: interim ``1xx`` answers (``100 Continue``, ``103 Early
Hints``) are skipped; the answer to ``HEAD`` and ``204``/``304`` answers have no
body whatever their length fields say; a body without length is read until the
upstream closes (never reused); chunk extensions are ignored and trailer fields
dropped (WSGI cannot send trailers, and a proxy may drop them, RFC 9110 §6.5.1).
Bytes after a complete answer are not relayed and make its connection unusable.
"""

from __future__ import annotations

import re

import httptools

from ..core.errors import BadRequest
from ..core.http import HOP_BY_HOP, connection_tokens, named_by_connection

MAX_HEAD = 256 * 1024
_CTL_IN_REASON = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class UpstreamProtocolError(Exception):
    """The upstream's answer breaks HTTP/1.1 framing or the rules above; the message says how."""


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


def request_head(method: str, target: str, host: str, headers: list[tuple[str, str]],
                 content_length: int | None, chunked: bool) -> bytes:
    """The request line and header block; ``Host`` and the framing field are ours.

    :raises BadRequest: a name or value with a line break (it would start a header,
        or a request, of its own).
    """
    tail = "".join([f"{name}: {value}\r\n" for name, value in headers])
    # One count over the joined block instead of two tests per field.
    if tail.count("\n") != len(headers) or tail.count("\r") != len(headers):
        bad = next(name for name, value in headers if "\n" in name + value or "\r" in name + value)
        raise BadRequest(f"header {bad} contains a line break")
    if content_length is not None:
        tail = f"{tail}Content-Length: {content_length}\r\n"
    elif chunked:
        tail = f"{tail}Transfer-Encoding: chunked\r\n"
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{tail}\r\n"
    try:
        return head.encode("latin-1")
    except UnicodeEncodeError:
        # Field values from WSGI are latin-1 already; only our own (an impersonated user's
        # name) can hold other characters, sent as UTF-8 as Go clients send them.
        if not all(name.isascii() for name, _ in headers):
            raise BadRequest("a header name is not ASCII") from None
        return head.encode("utf-8")


# What a response field is to the reader. An upstream repeats most of its fields byte
# for byte from one answer to the next (Server, Content-Type, Connection...; Date once
# a second), so a field is decoded and classified once and then looked up: bounded in
# count (the table starts over when full) and, through _CACHED_FIELD, in size.
_END_TO_END, _CONTENT_LENGTH, _TRANSFER_ENCODING, _CONNECTION, _UPGRADE, _HOP = range(6)
_KINDS = {"content-length": _CONTENT_LENGTH, "transfer-encoding": _TRANSFER_ENCODING,
          "connection": _CONNECTION, "upgrade": _UPGRADE}
_Field = tuple[tuple[str, str], int]
_fields: dict[tuple[bytes, bytes], _Field] = {}
_MAX_FIELDS = 1024
_CACHED_FIELD = 256


def _field(name: bytes, value: bytes) -> _Field:
    """``(name, value)`` as received → ((name, value without surrounding blanks), kind)."""
    found = _fields.get((name, value))
    if found is None:
        text = name.decode("latin-1")
        lower = text.lower()
        found = ((text, value.decode("latin-1").strip(" \t")),
                 _KINDS.get(lower, _HOP if lower in HOP_BY_HOP else _END_TO_END))
        if len(name) + len(value) <= _CACHED_FIELD:
            if len(_fields) >= _MAX_FIELDS:
                _fields.clear()
            _fields[name, value] = found
    return found


# Reason phrases seen to be clean ("OK", "Not Found"...), bounded like _fields.
_clean_reasons: set[bytes] = set()


def _clean_reason(reason: bytes) -> bool:
    if reason in _clean_reasons:
        return True
    if _CTL_IN_REASON.search(reason):
        return False
    if len(reason) <= 64:
        if len(_clean_reasons) >= 256:
            _clean_reasons.clear()
        _clean_reasons.add(reason)
    return True


class _Stop(Exception):
    """Raised from a callback to stop llhttp: what follows is not part of this answer."""


class ResponseReader:
    """One upstream answer, fed the bytes received: its head, then its body pieces.

    :param head_request: the request was ``HEAD`` (the answer has no body).
    :param upgrade_requested: the request asked to upgrade (decided by the caller);
        only then is a ``101`` accepted.

    :meth:`feed` raises :class:`UpstreamProtocolError`. Once :attr:`head_complete`,
    ``status``, ``reason``, ``headers`` (every field, decoded as latin-1),
    ``end_to_end`` (without hop-by-hop fields and those ``Connection`` names: what a
    proxy relays), ``length`` (``None`` when the body is chunked or read until close)
    and ``keep_alive`` are set; body bytes collect in ``pieces``; :attr:`complete`
    when the answer has ended. After a ``101``, ``leftover`` holds the bytes that
    followed its head (the other protocol's).
    """

    # Class-level defaults: an answer sets few of them, and each set costs.
    _reason = b""
    _fed = 0
    head_complete = False
    complete = False
    reusable = True
    until_close = False
    status = 0
    reason = ""
    length: int | None = None
    keep_alive = False
    leftover = b""

    def __init__(self, *, head_request: bool = False, upgrade_requested: bool = False) -> None:
        self._head_request = head_request
        self._upgrade_requested = upgrade_requested
        # The parser calls back into this object (a reference cycle, broken by release()).
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        # The framing and hop-by-hop fields of the head being read, for the rules below.
        self._special: list[_Field] = []
        self.headers: list[tuple[str, str]] = []
        self.end_to_end: list[tuple[str, str]] = []
        self.pieces: list[bytes] = []

    def feed(self, data: bytes) -> None:
        """Parse received bytes (callbacks fill the head and ``pieces``)."""
        if self.complete:
            self.reusable = False  # bytes after the answer: not ours to relay
            return
        if not self.head_complete:
            # The head (interim answers included) must end within MAX_HEAD bytes.
            room = MAX_HEAD - self._fed
            if len(data) > room:
                self._parse(data[:room])
                if not self.head_complete:
                    raise UpstreamProtocolError("response head too large")
                if self._parser is None:  # a 101: the rest is the other protocol's
                    self.leftover += data[room:]
                    return
                data = data[room:]
            self._fed += len(data)
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # after a 101, or released
            raise UpstreamProtocolError("no answer is being read")
        if self.complete:
            self.reusable = False
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.leftover = data[upgrade.args[0]:]
            self.release()
        except httptools.HttpParserError as exc:
            if self.complete:
                self.reusable = False  # the answer was whole; what followed was not ours
                return
            cause = exc.__context__
            raise UpstreamProtocolError(
                str(cause) if isinstance(cause, UpstreamProtocolError) else str(exc) or "malformed"
            ) from None

    def end_of_input(self) -> None:
        """The upstream closed the connection: the end of a body read until close, else an error."""
        self.reusable = False
        if self.complete:
            return
        if self.head_complete and self.until_close:
            self.complete = True
            self.release()
            return
        raise UpstreamClosed("connection closed before the answer was complete"
                             if self._fed else "connection closed before the response")

    def release(self) -> None:
        """Drop the parser (ends the reference cycle); nothing more is parsed."""
        self._parser = None

    # --- llhttp callbacks -------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_complete:  # trailer fields: dropped
            return
        found = _fields.get((name, value)) or _field(name, value)
        self.headers.append(found[0])
        kind = found[1]
        if kind <= _CONTENT_LENGTH:
            self.end_to_end.append(found[0])
        if kind:
            self._special.append(found)

    def on_headers_complete(self) -> None:
        if self.head_complete:  # a second answer: not asked for, not ours to relay
            self.reusable = False
            raise _Stop
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim(status)
            return
        self._final(status, parser.get_http_version())

    def on_body(self, data: bytes) -> None:
        if self.complete:  # the answer to HEAD has ended at its head
            self.reusable = False
            raise _Stop
        self.pieces.append(data)

    def on_message_complete(self) -> None:
        if self.head_complete and self.status != 101:
            self.complete = True

    # --- the rules ----------------------------------------------------------------------

    def _interim(self, status: int) -> None:
        for (_name, value), kind in self._special:
            if kind == _TRANSFER_ENCODING or (kind == _CONTENT_LENGTH and value != "0"):
                raise UpstreamProtocolError(f"a {status} answer with a body length")
        # 100 Continue, 103 Early Hints: skipped.
        self._reason = b""
        self._special = []
        self.headers = []
        self.end_to_end = []

    def _final(self, status: int, version: str) -> None:
        if not 100 <= status <= 599:
            raise UpstreamProtocolError("status code out of range")
        if version not in ("1.1", "1.0"):
            raise UpstreamProtocolError(f"unsupported version HTTP/{version}")
        if not _clean_reason(self._reason):
            raise UpstreamProtocolError("control character in the reason phrase")
        length = coding = connection = None
        upgrade = False
        for field, kind in self._special:
            if kind == _CONTENT_LENGTH:
                length = field[1]  # digits only, and only one (llhttp checked)
            elif kind == _TRANSFER_ENCODING:
                coding = f"{coding},{field[1]}" if coding is not None else field[1]
            elif kind == _CONNECTION:
                connection = f"{connection}, {field[1]}" if connection else field[1]
            elif kind == _UPGRADE:
                upgrade = True
        if coding is not None:
            if [token.strip().lower() for token in coding.split(",")] != ["chunked"]:
                raise UpstreamProtocolError("a transfer coding other than chunked")
            if version == "1.0":
                raise UpstreamProtocolError("Transfer-Encoding in an HTTP/1.0 answer")
            if status == 204:
                raise UpstreamProtocolError("Transfer-Encoding in a 204 answer")
        if status == 204 and length not in (None, "0"):
            raise UpstreamProtocolError("a 204 answer with a body length")
        tokens = connection_tokens(connection)
        if status == 101:
            if not self._upgrade_requested:
                raise UpstreamProtocolError("101 Switching Protocols to a request that did not "
                                            "ask to upgrade")
            if not upgrade or "upgrade" not in tokens:
                raise UpstreamProtocolError("101 without Upgrade and Connection: upgrade")
        if connection:
            named = named_by_connection(connection)
            if named:
                self.end_to_end = [f for f in self.end_to_end if f[0].lower() not in named]
        self.status = status
        self.reason = self._reason.decode("latin-1")
        self.keep_alive = version == "1.1" and "close" not in tokens
        self.head_complete = True
        if self._head_request or status in (204, 304, 101):
            self.length = 0
            self.complete = status != 101
        elif coding is not None:
            self.length = None
        elif length is not None:
            self.length = int(length)
        else:
            self.length = None
            self.until_close = True
            self.keep_alive = False
