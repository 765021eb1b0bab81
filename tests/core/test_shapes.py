"""Environ scans remembered per shape, and never at the cost of holding a client's huge header names."""

from __future__ import annotations

from typing import Any

from bcs_middleware.apps import proxy_request
from bcs_middleware.core.cache import Cache
from bcs_middleware.core.shapes import MAX_SHAPE_CHARS, small_shape
from bcs_middleware.layers.kubernetes_route import _impersonation_keys, client_impersonation_keys


def _environ(*headers: str) -> dict[str, Any]:
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": "/x", "wsgi.input": None}
    environ.update({f"HTTP_{name}": "v" for name in headers})
    return environ


def test_a_shape_is_scanned_once() -> None:
    scanned: list[tuple[str, ...]] = []
    cache: Cache[tuple[str, ...], int] = Cache(
        max_entries=256, loader=lambda keys: (scanned.append(keys), len(keys))[1], admit=small_shape)
    keys = ("A", "B", "C")
    assert cache(keys) == cache(tuple(["A", "B", "C"])) == 3
    assert scanned == [keys] and len(cache) == 1


def test_a_long_shape_is_scanned_every_time_and_never_kept() -> None:
    scanned: list[int] = []
    cache: Cache[tuple[str, ...], str] = Cache(
        max_entries=256, loader=lambda keys: (scanned.append(1), keys[-1])[1], admit=small_shape)
    long_keys = ("A" * MAX_SHAPE_CHARS, "B" * 60)
    assert cache(long_keys) == cache(long_keys) == "B" * 60
    assert len(scanned) == 2 and len(cache) == 0


def test_a_full_cache_stays_bounded() -> None:
    cache: Cache[tuple[str, ...], str] = Cache(max_entries=8, loader=lambda keys: keys[0], admit=small_shape)
    for n in range(100):
        assert cache((f"K{n}",)) == f"K{n}"
        assert len(cache) <= 8


def test_huge_header_names_are_not_held_by_the_request_scans() -> None:
    # 100 headers with 8 000-character names (gunicorn's limits allow this), 300 different
    # shapes: an lru_cache on the key tuple would have held ~240 MB of names.
    plans_before, imp_before = len(proxy_request._header_plan), len(_impersonation_keys)
    for n in range(300):
        names = [f"X_{n}_{i}_" + "N" * 8000 for i in range(100)]
        environ = _environ(*names, "IMPERSONATE_USER")
        assert client_impersonation_keys(environ) == ("HTTP_IMPERSONATE_USER",)
        passing, _ = proxy_request._header_plan(tuple(environ))
        assert len(passing) == 100  # every header but Impersonate-User is passed
    assert len(proxy_request._header_plan) == plans_before
    assert len(_impersonation_keys) == imp_before


def test_ordinary_shapes_are_remembered() -> None:
    environ = _environ("HOST", "USER_AGENT", "ACCEPT", "AUTHORIZATION", "IMPERSONATE_GROUP")
    assert client_impersonation_keys(environ) == ("HTTP_IMPERSONATE_GROUP",)
    assert tuple(environ) in _impersonation_keys
    passing, _ = proxy_request._header_plan(tuple(environ))
    assert [name for _, name, _ in passing] == ["User-Agent", "Accept"]  # Host is the upstream's
    assert tuple(environ) in proxy_request._header_plan


def test_long_connection_values_and_header_names_are_not_remembered() -> None:
    from bcs_middleware.core import http as codec

    tokens_before = len(codec._tokens)
    named_before = len(codec._named)
    info_before = len(proxy_request._header_info)
    for n in range(50):
        value = f"keep-alive, X-{n}-" + "a" * 5000
        assert codec.named_by_connection(value) == {f"x-{n}-" + "a" * 5000}
        assert codec.connection_tokens(value) == {"keep-alive", f"x-{n}-" + "a" * 5000}
        proxy_request._header_plan(tuple(_environ(f"LONG_{n}_" + "N" * 200)))
    assert len(codec._tokens) == tokens_before
    assert len(codec._named) == named_before
    assert len(proxy_request._header_info) == info_before
    assert codec.named_by_connection("keep-alive, X-Private") == {"x-private"}  # short: cached
