"""``MetricBatch``: deferred request metrics end up exactly where direct updates would."""

from __future__ import annotations

import os
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, generate_latest

from bcs_middleware.telemetry.metrics import MetricBatch
from tests.support.polling import wait_until

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def _pair(kind: type, name: str, **kwargs: object) -> tuple[CollectorRegistry, object, CollectorRegistry, object]:
    direct_registry, batched_registry = CollectorRegistry(), CollectorRegistry()
    direct = kind(name, "help", ["kind", "method"], registry=direct_registry, **kwargs)
    batched = kind(name, "help", ["kind", "method"], registry=batched_registry, **kwargs)
    return direct_registry, direct, batched_registry, batched


def _exposition(registry: CollectorRegistry) -> list[str]:
    # The _created timestamps differ between the two registries; everything else must not.
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_batched_histogram_and_counter_equal_direct_updates() -> None:
    rng = random.Random(3)  # noqa: S311 - reproducible test data
    h_direct_reg, h_direct, h_batched_reg, h_batched = _pair(Histogram, "lat", buckets=BUCKETS)
    c_direct_reg, c_direct, c_batched_reg, c_batched = _pair(Counter, "req")
    batch = MetricBatch(period=3600)  # only explicit flushes here
    # Values exactly on bucket bounds belong to that bucket (le), plus some past the last one.
    values = [*BUCKETS, 0.0, 45.0, *(rng.uniform(0, 12) ** 2 / 10 for _ in range(3000))]
    for n, value in enumerate(values):
        labels = ("tunnel", "GET") if n % 3 else ("rest", "POST")
        h_direct.labels(*labels).observe(value)  # type: ignore[attr-defined]
        batch.observe(h_batched, value, *labels)
        c_direct.labels(*labels).inc()  # type: ignore[attr-defined]
        batch.inc(c_batched, *labels)
    assert _exposition(h_batched_reg) != _exposition(h_direct_reg)  # nothing applied yet
    batch.flush()
    assert _exposition(h_batched_reg) == _exposition(h_direct_reg)
    assert _exposition(c_batched_reg) == _exposition(c_direct_reg)


def test_request_counts_and_times_like_two_direct_updates() -> None:
    """``request()`` queues one item for both per-request metrics; applied, they read as if
    ``REQUESTS.inc()`` and ``LATENCY.observe()`` had been called directly."""
    from bcs_middleware.telemetry import metrics

    rng = random.Random(5)  # noqa: S311 - reproducible test data
    calls = [(rng.choice(["tunnel", "rest"]), rng.choice(["", "BCS-K8S-1"]), rng.choice(["GET", "PUT"]),
              rng.choice(["200", "404"]), rng.uniform(0, 2)) for _ in range(500)]
    metrics.BATCH.flush()

    def snapshot() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in (metrics.REQUESTS, metrics.LATENCY) for s in family.collect()[0].samples
                if not s.name.endswith("_created")}

    before = snapshot()
    batch = MetricBatch(period=3600)
    for kind, cluster, method, code, seconds in calls:
        batch.request(kind, cluster, method, code, seconds)
    batch.flush()
    after = snapshot()
    for kind, cluster, method, code, seconds in calls:
        metrics.REQUESTS.labels(kind, cluster, method, code).inc()
        metrics.LATENCY.labels(kind, method).observe(seconds)
    direct = snapshot()
    # The same increase as the direct updates (floats: sums compared to rounding).
    for key, value in direct.items():
        assert after.get(key, 0) - before.get(key, 0) == pytest.approx(value - after.get(key, 0)), key
    assert any(after.get(key, 0) != before.get(key, 0) for key in direct)


def test_a_metric_without_histogram_internals_gets_plain_observes() -> None:
    direct_reg, direct, batched_reg, batched = _pair(Summary, "size")
    batch = MetricBatch(period=3600)
    for value in (1.0, 2.5, 4.0):
        direct.labels("a", "b").observe(value)  # type: ignore[attr-defined]
        batch.observe(batched, value, "a", "b")
    batch.flush()
    assert _exposition(batched_reg) == _exposition(direct_reg)


def test_the_background_thread_applies_updates_within_the_period() -> None:
    registry = CollectorRegistry()
    counter = Counter("hits", "help", ["result"], registry=registry)
    batch = MetricBatch(period=0.05)
    for _ in range(5):
        batch.inc(counter, "hit")
    wait_until(lambda: registry.get_sample_value("hits_total", {"result": "hit"}) == 5, 5, step=0.01)
    assert registry.get_sample_value("hits_total", {"result": "hit"}) == 5


def test_a_forked_child_starts_empty() -> None:
    registry = CollectorRegistry()
    counter = Counter("forked", "help", ["result"], registry=registry)
    batch = MetricBatch(period=3600)
    batch.inc(counter, "parent")
    pid = os.fork()
    if pid == 0:  # the child: the parent's pending update is not its to apply
        batch.flush()
        os._exit(0 if registry.get_sample_value("forked_total", {"result": "parent"}) is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    batch.flush()
    assert registry.get_sample_value("forked_total", {"result": "parent"}) == 1


def test_record_named_label_values_are_capped_per_process() -> None:
    from bcs_middleware.telemetry.metrics import OTHER, BoundedValues

    bounded = BoundedValues(limit=3)
    assert [bounded(v) for v in ("a", "b", "c", "d", "a", "e")] == ["a", "b", "c", OTHER, "a", OTHER]


def test_cluster_ids_beyond_the_cap_count_under_other() -> None:
    from bcs_middleware.telemetry import metrics

    batch = metrics.MetricBatch(period=60)
    saved = metrics.cluster_label
    metrics.cluster_label = metrics.BoundedValues(limit=1)
    try:
        for cluster in ("cap-a", "cap-b", "cap-c"):
            batch.request("tunnel", cluster, "GET", "200", 0.01)
        batch.flush()
    finally:
        metrics.cluster_label = saved
    assert metrics.REQUESTS.labels("tunnel", "cap-a", "GET", "200")._value.get() == 1
    assert metrics.REQUESTS.labels("tunnel", metrics.OTHER, "GET", "200")._value.get() >= 2
