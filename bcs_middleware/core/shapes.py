"""Scans of a WSGI environ's keys, remembered per *shape* (the tuple of its keys).

A client's requests carry the same headers from one request to the next, so the
environ of its requests has the same keys in the same order: a scan of them (which
headers to forward, whether any ``Impersonate-*`` header came) is done once per shape,
through a :class:`~bcs_middleware.core.cache.Cache` keyed by the shape.

The keys include the client's own header names, each up to the server's field-size
limit (8 KiB under gunicorn) and up to a hundred of them: a cache admitting every shape
would let one client fill it with megabytes of header names. A shape longer than
:data:`MAX_SHAPE_CHARS` in all is scanned every time instead of remembered
(:func:`small_shape` is the caches' ``admit``), which bounds the memory to
``max_entries * MAX_SHAPE_CHARS`` characters. The size is only measured on a miss.
"""

from __future__ import annotations

MAX_SHAPE_CHARS = 4096


def small_shape(keys: tuple[str, ...]) -> bool:
    """Whether a shape is short enough to be remembered."""
    return sum(map(len, keys)) <= MAX_SHAPE_CHARS
