"""The one cache (:class:`Cache`): bounded by count, idle time and age; a loader; thread-safe."""

from __future__ import annotations

import threading

import pytest

from bcs_middleware.core.cache import Cache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- store answers: kept max_age after loading ----------------------------------------------


def test_an_answer_expires_max_age_after_loading_however_often_it_is_used() -> None:
    clock, loads = Clock(), []
    cache: Cache[str, int | None] = Cache(max_entries=100, max_age=5, clock=clock)

    def load(key: str) -> int | None:
        loads.append(key)
        return None  # a negative answer is an answer: cached too

    for _ in range(10):
        assert cache.load("k", load) is None
        clock.now += 0.9  # a hot key: used every 0.9 s
    assert loads == ["k", "k"]  # reloaded once 5 s had passed since loading, not kept alive by use


def test_a_full_cache_drops_the_oldest_loaded_first() -> None:
    cache: Cache[int, int] = Cache(max_entries=3, max_age=60)
    for key in range(5):
        cache.load(key, lambda k: k * 10)
    assert len(cache) == 3 and 0 not in cache and 1 not in cache and 4 in cache


def test_a_failed_load_is_not_cached() -> None:
    cache: Cache[str, int] = Cache(max_entries=10, max_age=60)

    def failing(key: str) -> int:
        raise RuntimeError("store down")

    with pytest.raises(RuntimeError, match="store down"):
        cache.load("k", failing)
    assert "k" not in cache and cache.load("k", lambda k: 1) == 1


def test_max_age_zero_caches_nothing() -> None:
    cache: Cache[str, int] = Cache(max_entries=10, max_age=0)
    calls = []
    for _ in range(3):
        cache.load("k", lambda k: calls.append(k) or 1)
    assert len(calls) == 3 and len(cache) == 0


def test_forget_makes_the_next_load_load_again() -> None:
    cache: Cache[str, int] = Cache(max_entries=10, max_age=60)
    loads: list[str] = []
    cache.load("k", lambda k: loads.append(k) or 1)
    cache.forget("k")
    cache.load("k", lambda k: loads.append(k) or 2)
    assert loads == ["k", "k"] and cache.load("k", lambda k: 3) == 2


# -- state kept while used: count and idle time, on_evict -------------------------------------


def test_the_least_recently_used_entry_goes_first_and_is_handed_to_on_evict() -> None:
    evicted: list[tuple[str, int]] = []
    cache: Cache[str, int] = Cache(max_entries=2, on_evict=lambda k, v: evicted.append((k, v)),
                                   clock=Clock())
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert evicted == [("b", 2)]
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3


def test_on_evict_is_called_outside_the_lock_and_may_use_the_cache() -> None:
    # It may close sockets (the idle pool) or use the cache itself: never under the cache's lock.
    clock = Clock()
    seen: list[tuple[str, int | None]] = []
    cache: Cache[str, int] = Cache(max_entries=1, ttl=5, clock=clock,
                                   on_evict=lambda k, v: seen.append((k, cache.get("b"))))
    cache.put("a", 1)
    cache.put("b", 2)  # "a" goes over the count
    clock.now += 6
    assert cache.get("b") is None  # "b" expired: dropped by the read
    assert seen == [("a", 2), ("b", None)]


def test_entries_unused_for_the_ttl_are_dropped_without_new_inserts() -> None:
    clock = Clock()
    evicted: list[str] = []
    cache: Cache[str, int] = Cache(max_entries=100, ttl=10, clock=clock,
                                   on_evict=lambda k, v: evicted.append(k))
    cache.put("old", 1)
    cache.put("hot", 2)
    for _ in range(6):
        clock.now += 3
        assert cache.get("hot") == 2
    assert "old" not in cache and evicted == ["old"]
    clock.now += 11
    cache.prune()
    assert len(cache) == 0


def test_an_entry_past_max_age_is_gone_however_recently_used() -> None:
    clock = Clock()
    cache: Cache[str, int] = Cache(max_entries=10, ttl=100, max_age=10, clock=clock)
    cache.put("k", 1)
    for _ in range(3):
        clock.now += 3
        assert cache.get("k") == 1
    clock.now += 3
    assert cache.get("k") is None and "k" not in cache


def test_max_entries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        Cache(max_entries=0)


# -- a bounded memoized function: loader and admit -------------------------------------------


def test_a_cache_with_a_loader_remembers_each_admitted_key_once() -> None:
    computed: list[str] = []
    square: Cache[str, str] = Cache(max_entries=8, loader=lambda k: computed.append(k) or k * 2,
                                    admit=lambda k: len(k) <= 3)
    assert square("ab") == square("ab") == "abab"
    assert square("abcd") == square("abcd") == "abcdabcd"
    assert computed == ["ab", "abcd", "abcd"]  # the long key is computed every time, never kept
    assert "ab" in square and "abcd" not in square


def test_a_memoized_function_stays_bounded_and_drops_the_least_recently_used() -> None:
    cache: Cache[int, int] = Cache(max_entries=8, loader=lambda k: -k)
    for n in range(100):
        assert cache(n % 9 if n < 50 else n) == -(n % 9 if n < 50 else n)
        assert len(cache) <= 8
    assert 99 in cache and 0 not in cache


def test_load_without_any_loader_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="loader"):
        Cache[str, int](max_entries=1).load("k")


def test_threads_hitting_loading_and_evicting_together_never_corrupt_it() -> None:
    clock = Clock()
    evicted: list[int] = []
    cache: Cache[int, int] = Cache(max_entries=16, ttl=1000, loader=lambda k: k * 3,
                                   on_evict=lambda k, v: evicted.append(k), clock=clock)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(3000):
                key = (seed * 7 + i) % 40
                assert cache(key) == key * 3
                if i % 50 == 0:
                    cache.pop(key)
                got = cache.get(key)
                assert got is None or got == key * 3
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and all(not thread.is_alive() for thread in threads)
    assert len(cache) <= 16 and evicted


def test_a_remembered_function_keeps_what_is_used_and_drops_what_is_not() -> None:
    """Hits take no lock and leave the order alone; the entry due for eviction that was used
    since is spared once (CLOCK), so a hot key survives a stream of cold ones."""
    loads: list[str] = []
    cache: Cache[str, str] = Cache(max_entries=3, loader=lambda key: loads.append(key) or key.upper())
    cache("hot")
    for number in range(20):
        assert cache("hot") == "HOT"  # used between every two cold keys
        cache(f"cold-{number}")
    assert loads.count("hot") == 1
    assert len(cache.held_keys()) == 3 and "cold-0" not in cache.held_keys()


def test_lock_free_hits_beside_puts_and_evictions_in_threads() -> None:
    cache: Cache[int, int] = Cache(max_entries=8, loader=lambda key: key * 2)
    errors: list[BaseException] = []

    def hammer(offset: int) -> None:
        try:
            for number in range(20000):
                assert cache((number + offset) % 24) == ((number + offset) % 24) * 2
                if number % 97 == 0:
                    cache.values()
                    cache.held_keys()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]
    assert len(cache.held_keys()) <= 8
