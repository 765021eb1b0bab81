"""A remote-command session's bytes, as the splice moved them, turned into asciicast v2 text (pure).

:class:`CastEncoder` takes ``(monotonic time, to_upstream, bytes)`` items in the order the
splice saw them and returns the recording's lines: stdout and stderr as ``"o"`` (a terminal
shows both), resizes as ``"r"``, stdin as ``"i"`` only when asked (it carries passwords typed
at prompts). The header's size is the terminal's first size the client reports (kubectl
sends it at once with a tty, though the pod may print first): the first events wait for it,
at most :data:`HEADER_WAIT` seconds or :data:`HEADER_HOLD` bytes, then
:data:`~.asciicast.DEFAULT_SIZE` is written.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import asciicast
from .spdy import SpdyDecoder
from .terminal import Piece, TerminalTracker, parse_sizes
from .websocket import ChannelDecoder

__all__ = ["CastEncoder", "Item"]

#: The longest the header waits for the terminal's size (seconds of the session, bytes of events).
HEADER_WAIT = 2.0
HEADER_HOLD = 256 * 1024

#: What the splice hands over: (``time.monotonic()``, towards the upstream?, the bytes).
Item = tuple[float, bool, bytes]


class CastEncoder:
    """One session's asciicast text, built as its bytes arrive.

    :param transport: ``"websocket"`` or ``"spdy"`` (the ``Upgrade`` the apiserver accepted).
    :param subprotocol: WebSocket: the subprotocol the apiserver's ``101`` named (its codec).
    :param started: the session's start, on the clock of the items (``time.monotonic()``).
    :param timestamp: the start as epoch seconds (the header's ``timestamp``).
    :param stdin: record what the user typed (``"i"`` events).
    :param title: the header's ``title``.
    """

    def __init__(self, transport: str, *, started: float, timestamp: float, stdin: bool = False,
                 title: str = "", subprotocol: str = "") -> None:
        self._decoder: ChannelDecoder | SpdyDecoder = \
            SpdyDecoder() if transport == "spdy" else ChannelDecoder(subprotocol)
        self._spdy = transport == "spdy"
        self._started = started
        self._timestamp = int(timestamp)
        self._stdin = stdin
        self._title = title
        self._text = {"stdout": asciicast.TextStream(), "stderr": asciicast.TextStream(),
                      "stdin": asciicast.TextStream()}
        self._resize = bytearray()
        self._header_written = False
        self._held: list[str] = []
        self._held_bytes = 0
        self.tracker = TerminalTracker()
        self.size: tuple[int, int] | None = None
        self.last_time = 0.0

    def encode(self, items: Iterable[Item]) -> str:
        """The lines these items add (the header first, on the first call)."""
        events: list[tuple[float, str, str]] = []
        for when, to_upstream, data in items:
            at = max(when - self._started, 0.0)
            for piece in self._decoder.feed(to_upstream, data):
                self._event(at, piece, events)
        lines = [asciicast.event_line(at, code, data) for at, code, data in events]
        if events:
            self.last_time = events[-1][0]
        if self._header_written:
            return "".join(lines)
        self._held.extend(lines)
        self._held_bytes += sum(len(line) for line in lines)
        if self.size is None and self.last_time < HEADER_WAIT and self._held_bytes < HEADER_HOLD:
            return ""
        return self._release()

    def _release(self) -> str:
        text = self._header() + "".join(self._held)
        self._header_written = True
        self._held, self._held_bytes = [], 0
        return text

    def finish(self, when: float) -> str:
        """What is left in the text decoders (a character cut short by the end)."""
        at = max(when - self._started, self.last_time)
        lines = [] if self._header_written else [self._release()]
        for name, code in (("stdout", "o"), ("stderr", "o"), ("stdin", "i")):
            rest = self._text[name].flush()
            if rest and (code == "o" or self._stdin):
                lines.append(asciicast.event_line(at, code, rest))
        return "".join(lines)

    @property
    def exit_code(self) -> int | None:
        return self.tracker.exit_code(empty_is_success=self._spdy)

    @property
    def broken(self) -> str:
        return self._decoder.broken if isinstance(self._decoder, SpdyDecoder) else ""

    def _event(self, at: float, piece: Piece, events: list[tuple[float, str, str]]) -> None:
        if piece.stream in ("stdout", "stderr"):
            text = self._text[piece.stream].feed(piece.data)
            if text:
                events.append((at, "o", text))
        elif piece.stream == "stdin":
            text = self._text["stdin"].feed(piece.data)  # decoded even when not kept: bounded state
            if text and self._stdin:
                events.append((at, "i", text))
        elif piece.stream == "resize":
            self._resize += piece.data
            for cols, rows in parse_sizes(self._resize):
                if self.size is None and not self._header_written:
                    self.size = (cols, rows)
                events.append((at, "r", asciicast.resize_data(cols, rows)))
        elif piece.stream == "error":
            self.tracker.feed_error(piece)

    def _header(self) -> str:
        width, height = self.size or asciicast.DEFAULT_SIZE
        if self.size is None:
            self.size = (width, height)
        return asciicast.header_line(asciicast.Header(width, height, self._timestamp, self._title))
