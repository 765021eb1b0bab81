"""asciicast v2: the file format ``asciinema`` records and plays (pure).

A recording is a header line, a JSON object (``version`` 2, ``width``, ``height``,
``timestamp``, optional ``title`` and ``env``), then one JSON array per line:
``[seconds since the start, code, data]`` where ``code`` is ``"o"`` (output),
``"i"`` (input) or ``"r"`` (the terminal resized, data ``"COLSxROWS"``); see
https://docs.asciinema.org/manual/asciicast/v2/. ``data`` is text: output bytes are
decoded as UTF-8 incrementally (:class:`TextStream`), so a character split across two
frames is one character, and a byte that is not UTF-8 becomes U+FFFD as a terminal
would show it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SIZE", "Event", "Header", "TextStream", "event_line", "header_line", "parse"]

#: A terminal's size before its client reports one (kubectl does, right after the start, with a tty).
DEFAULT_SIZE = (80, 24)


@dataclass(frozen=True)
class Header:
    width: int
    height: int
    timestamp: int
    title: str = ""
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    time: float
    code: str
    data: str


def header_line(header: Header) -> str:
    doc: dict[str, Any] = {"version": 2, "width": header.width, "height": header.height,
                           "timestamp": header.timestamp}
    if header.title:
        doc["title"] = header.title
    if header.env:
        doc["env"] = header.env
    return json.dumps(doc, ensure_ascii=False) + "\n"


def event_line(time: float, code: str, data: str) -> str:
    # Six decimals, as asciinema writes; ensure_ascii=False keeps text readable and
    # escapes every control character (JSON requires it), so one event is one line.
    return f"[{time:.6f}, {json.dumps(code)}, {json.dumps(data, ensure_ascii=False)}]\n"


def resize_data(cols: int, rows: int) -> str:
    return f"{cols}x{rows}"


class TextStream:
    """Bytes of one stream to text, a multi-byte character split across pieces kept whole."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def parse(lines: Iterable[str]) -> tuple[Header, Iterator[Event]]:
    """A recording's header and its events, read lazily; :class:`ValueError` when it is not asciicast v2."""
    it = iter(lines)
    first = next(it, "")
    try:
        doc = json.loads(first)
    except json.JSONDecodeError:
        raise ValueError("not an asciicast v2 recording: the first line is not a JSON header") from None
    if not isinstance(doc, dict) or doc.get("version") != 2:
        raise ValueError("not an asciicast v2 recording: the header has no version 2")
    header = Header(int(doc.get("width", DEFAULT_SIZE[0])), int(doc.get("height", DEFAULT_SIZE[1])),
                    int(doc.get("timestamp", 0)), str(doc.get("title", "")), dict(doc.get("env") or {}))

    def events() -> Iterator[Event]:
        for line in it:
            if not line.strip():
                continue
            item = json.loads(line)
            if not (isinstance(item, list) and len(item) == 3):
                raise ValueError(f"not an asciicast v2 event: {line[:80]!r}")
            yield Event(float(item[0]), str(item[1]), str(item[2]))

    return header, events()
