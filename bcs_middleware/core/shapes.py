"""Scans of a WSGI environ's keys, remembered per *shape* (the tuple of its keys).

A client's requests carry the same headers from one request to the next, so the
environ of its requests has the same keys in the same order: a scan of them (which
headers to forward, whether any ``Impersonate-*`` header came) is done once per shape.

The keys include the client's own header names, each up to the server's field-size
limit (8 KiB under gunicorn) and up to a hundred of them: a plain ``lru_cache`` on the
key tuple would let one client fill it with megabytes of header names. A shape longer
than ``max_chars`` in all is scanned every time instead of remembered, which bounds
the memory to ``max_entries * max_chars`` characters. The size is only measured on a
miss; a hit is one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ShapeCache(Generic[T]):
    """``cache(keys)`` is ``scan(keys)``, remembered for shapes up to ``max_chars`` long.

    Thread-safe under the GIL (single dict operations); when full it starts over,
    which costs a few re-scans and never a wrong answer.
    """

    def __init__(self, scan: Callable[[tuple[str, ...]], T], *, max_entries: int = 256,
                 max_chars: int = 4096) -> None:
        self.scan = scan
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._seen: dict[tuple[str, ...], T] = {}

    def __call__(self, keys: tuple[str, ...]) -> T:
        found = self._seen.get(keys)
        if found is not None:
            return found
        result = self.scan(keys)
        if sum(map(len, keys)) <= self.max_chars:
            if len(self._seen) >= self.max_entries:
                self._seen.clear()
            self._seen[keys] = result
        return result

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        self._seen.clear()
