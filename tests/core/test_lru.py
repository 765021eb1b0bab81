"""The one cache's store-answer policy (:class:`LoadingCache`): kept ``ttl`` after loading, bounded."""

from __future__ import annotations

import pytest

from bcs_middleware.core.lru import LoadingCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_expires_ttl_after_loading_however_often_it_is_used() -> None:
    clock, loads = Clock(), []
    cache: LoadingCache[str, int | None] = LoadingCache(ttl=5, clock=clock)

    def load(key: str) -> int | None:
        loads.append(key)
        return None  # a negative answer is an answer: cached too

    for _ in range(10):
        assert cache.get("k", load) is None
        clock.now += 0.9  # a hot key: used every 0.9 s
    assert loads == ["k", "k"]  # reloaded once 5 s had passed since loading, not kept alive by use


def test_a_full_cache_drops_the_oldest_loaded_first() -> None:
    cache: LoadingCache[int, int] = LoadingCache(ttl=60, max_entries=3)
    for key in range(5):
        cache.get(key, lambda k: k * 10)
    assert len(cache) == 3 and 0 not in cache and 1 not in cache and 4 in cache


def test_a_failed_load_is_not_cached() -> None:
    cache: LoadingCache[str, int] = LoadingCache(ttl=60)

    def failing(key: str) -> int:
        raise RuntimeError("store down")

    with pytest.raises(RuntimeError):
        cache.get("k", failing)
    assert "k" not in cache and cache.get("k", lambda k: 1) == 1


def test_ttl_zero_caches_nothing() -> None:
    cache: LoadingCache[str, int] = LoadingCache(ttl=0)
    calls = []
    for _ in range(3):
        cache.get("k", lambda k: calls.append(k) or 1)
    assert len(calls) == 3 and len(cache) == 0
