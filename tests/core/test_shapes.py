"""Environ scans remembered per shape, and never at the cost of holding a client's huge header names."""

from __future__ import annotations

from typing import Any

from bcs_middleware.apps import proxy
from bcs_middleware.core.shapes import ShapeCache
from bcs_middleware.layers.kubernetes_route import _impersonation_keys, impersonation_headers


def _environ(*headers: str) -> dict[str, Any]:
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": "/x", "wsgi.input": None}
    environ.update({f"HTTP_{name}": "v" for name in headers})
    return environ


def test_a_shape_is_scanned_once() -> None:
    scanned: list[tuple[str, ...]] = []
    cache = ShapeCache(lambda keys: (scanned.append(keys), len(keys))[1])
    keys = ("A", "B", "C")
    assert cache(keys) == cache(tuple(["A", "B", "C"])) == 3
    assert scanned == [keys] and len(cache) == 1


def test_a_long_shape_is_scanned_every_time_and_never_kept() -> None:
    scanned: list[int] = []
    cache = ShapeCache(lambda keys: (scanned.append(1), keys[-1])[1], max_chars=100)
    long_keys = ("A" * 60, "B" * 60)
    assert cache(long_keys) == cache(long_keys) == "B" * 60
    assert len(scanned) == 2 and len(cache) == 0


def test_a_full_cache_starts_over_and_stays_bounded() -> None:
    cache = ShapeCache(lambda keys: keys[0], max_entries=8)
    for n in range(100):
        assert cache((f"K{n}",)) == f"K{n}"
        assert len(cache) <= 8


def test_huge_header_names_are_not_held_by_the_request_scans() -> None:
    # 100 headers with 8 000-character names (gunicorn's limits allow this), 300 different
    # shapes: an lru_cache on the key tuple would have held ~240 MB of names.
    plans_before, imp_before = len(proxy._header_plan), len(_impersonation_keys)
    for n in range(300):
        names = [f"X_{n}_{i}_" + "N" * 8000 for i in range(100)]
        environ = _environ(*names, "IMPERSONATE_USER")
        assert impersonation_headers(environ) == ("HTTP_IMPERSONATE_USER",)
        passing, _ = proxy._header_plan(tuple(environ))
        assert len(passing) == 100  # every header but Impersonate-User is passed
    assert len(proxy._header_plan) == plans_before
    assert len(_impersonation_keys) == imp_before


def test_ordinary_shapes_are_remembered() -> None:
    environ = _environ("HOST", "USER_AGENT", "ACCEPT", "AUTHORIZATION", "IMPERSONATE_GROUP")
    assert impersonation_headers(environ) == ("HTTP_IMPERSONATE_GROUP",)
    assert tuple(environ) in _impersonation_keys._seen
    passing, _ = proxy._header_plan(tuple(environ))
    assert [name for _, name, _ in passing] == ["User-Agent", "Accept"]  # Host is the upstream's
    assert tuple(environ) in proxy._header_plan._seen


def test_long_connection_values_and_header_names_are_not_remembered() -> None:
    from bcs_middleware.core import http as codec

    tokens_before = codec._tokens.cache_info().currsize
    named_before = codec._named.cache_info().currsize
    info_before = proxy._header_info.cache_info().currsize
    for n in range(50):
        value = f"keep-alive, X-{n}-" + "a" * 5000
        assert codec.named_by_connection(value) == {f"x-{n}-" + "a" * 5000}
        assert codec.connection_tokens(value) == {"keep-alive", f"x-{n}-" + "a" * 5000}
        proxy._header_plan(tuple(_environ(f"LONG_{n}_" + "N" * 200)))
    assert codec._tokens.cache_info().currsize == tokens_before
    assert codec._named.cache_info().currsize == named_before
    assert proxy._header_info.cache_info().currsize == info_before
    assert codec.named_by_connection("keep-alive, X-Private") == {"x-private"}  # short: cached
