"""Concurrent large bodies cannot grow a gateway worker without bound (a real ``serve``, one worker).

Every admitted body is buffered with its decoded object; a user can send as many as they like at
once. The worker's peak RSS (``VmHWM`` after ``clear_refs``) is measured while 16 clients each POST
a ~3 MiB ConfigMap through the tunnel to a validating webhook, and while clients send 3 MiB of
``[{}, {}, …]`` (the most Python objects per byte). Before the admission budget, the first cost
the worker ~220 MiB and the second ~1.2 GiB (bench/README.md, "Admission memory").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLUSTER, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_until
from tests.support.webhooks import allow_configmaps, allow_review, served_webhook

PATH = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps"
MIB = 1 << 20


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, int]]:
    with served_webhook(allow_review) as hook, FakeAPIServer(token=SA_TOKEN) as api, \
            served_gateway(tmp_path_factory.mktemp("admission-memory"), workers=1) as gw:
        register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
        status, body = gw.call("POST", f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations",
                               body=allow_configmaps(hook))
        assert status == 201, body
        small = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "warm", "namespace": "default"}}).encode()
        assert wait_until(lambda: post(gw, small) in (201, 409), 30, 0.3)
        children = Path(f"/proc/{gw.server.proc.pid}/task/{gw.server.proc.pid}/children").read_text().split()
        [worker] = [int(pid) for pid in children]
        yield gw, worker


def post(gw: Gateway, body: bytes) -> int:
    return gw.call("POST", PATH, body=body, headers={"Content-Type": "application/json"}, timeout=120)[0]


def peak_growth_mib(worker: int, bodies: list[bytes], gw: Gateway) -> tuple[float, list[int]]:
    before = _vm_kib(worker, "VmRSS")
    Path(f"/proc/{worker}/clear_refs").write_text("5")  # VmHWM := VmRSS
    with ThreadPoolExecutor(len(bodies)) as pool:
        statuses = list(pool.map(lambda body: post(gw, body), bodies))
    return (_vm_kib(worker, "VmHWM") - before) / 1024, statuses


def test_sixteen_concurrent_3_mib_bodies_stay_within_the_admission_budget(gateway: tuple[Gateway, int]) -> None:
    gw, worker = gateway
    stamp = time.monotonic_ns()
    bodies = [json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": f"big-{stamp}-{i}", "namespace": "default"},
                          "data": {f"key-{n:08d}": "v" * 96 for n in range(27_000)}},
                         separators=(",", ":")).encode() for i in range(16)]
    assert all(2.9 * MIB < len(body) < 3 * MIB for body in bodies)
    growth, statuses = peak_growth_mib(worker, bodies, gw)
    # The budget (128 MiB of estimated decoded size, the estimate an upper bound) holds the rest back;
    # a request that waited longer than buffer_wait would get a 429, never a half-admitted write.
    assert set(statuses) <= {201, 429} and statuses.count(201) >= 8, statuses
    assert growth < 160, f"the worker grew {growth:.0f} MiB for 16 x 3 MiB in flight"


def test_bodies_of_too_many_values_are_refused_before_they_are_decoded(gateway: tuple[Gateway, int]) -> None:
    gw, worker = gateway
    dense = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "dense", "namespace": "default"},
                        "x": [{}] * 1_000_000}, separators=(",", ":")).encode()
    growth, statuses = peak_growth_mib(worker, [dense] * 4, gw)
    assert statuses == [413] * 4
    assert growth < 48, f"the worker grew {growth:.0f} MiB for 4 x 3 MiB of refused bodies"
