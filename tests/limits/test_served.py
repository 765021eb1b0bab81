"""Per-user limits attacked through a real ``bcs-middleware serve`` (two workers, HTTPS) and a
fake apiserver: a user over its rate, its in-flight cap or its long-running cap gets ``429``
with ``Retry-After`` and a ``Status`` that kubectl and the Python client wait out; the apiserver
never sees more than the caps from one user, whichever worker the connections land on; a
light user is served while a heavy one is held back.

Each attack uses a user of its own (overrides in the limits file), so the module's tests do
not share a bucket or a cap.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.kube import kubectl
from tests.support.polling import wait_until

CLUSTER = "limits-c1"
TUNNEL = f"/tunnels/clusters/{CLUSTER}"
PODS = f"{TUNNEL}/api/v1/namespaces/default/pods"
USERS = ("rated", "kubectl-user", "pyclient", "watcher", "heavy", "light", "spread", "hammer")
LIMITS = """
user: {rate: 1000, burst: 1000, inflight: 64, long_running: 100}
users:
  rated: {rate: 0.05, burst: 5}
  spread: {rate: 0.05, burst: 6}
  hammer: {rate: 0.05, burst: 1}
  kubectl-user: {rate: 2, burst: 2}
  pyclient: {rate: 0.5, burst: 1}
  watcher: {long_running: 3}
  heavy: {inflight: 4}
queue: {seats_per_worker: 8, length: 200, wait: 30s}
clients: {upstream_idle_per_cluster: 48, database_connections: 3, database_overflow: 2}
"""


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    tokens: dict[str, str]
    tmp: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("limits")
    limits = tmp / "limits.yaml"
    limits.write_text(LIMITS)
    with FakeAPIServer(token=SA_TOKEN) as api, \
            served_gateway(tmp / "data", args=["--limits-config", str(limits)], workers=2) as gw:
        register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
        tokens = {name: gw.user(name) for name in USERS}
        for name in USERS:
            gw.grant(name, "view", cluster=CLUSTER)
        api.store.create("pods", {"metadata": {"name": "web-1", "namespace": "default"},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        yield World(gw, api, tokens, tmp)
        output = gw.server.output()
        assert all(token not in output for token in tokens.values())


def _get(world: World, user: str, path: str, timeout: float = 30) -> requests.Response:
    """One request on a connection of its own (so connections spread over the workers)."""
    return requests.get(world.gw.url + path, headers={"Authorization": f"Bearer {world.tokens[user]}"},
                        verify=world.gw.ca_file, timeout=timeout)


def _refusals(world: World, user: str) -> int:
    """429 answers the access log shows for ``user``."""
    count = 0
    for line in world.gw.server.output().splitlines():
        start = line.find('{"time"')
        if start < 0:
            continue
        try:
            entry = json.loads(line[start:])
        except ValueError:
            continue
        count += entry.get("user") == user and entry.get("status") == 429
    return count


def test_over_its_rate_a_user_gets_429_with_retry_after_and_a_kubernetes_status(world: World) -> None:
    answers = [_get(world, "rated", PODS) for _ in range(7)]
    assert [a.status_code for a in answers[:5]] == [200] * 5
    refused = answers[5]
    assert refused.status_code == 429
    retry_after = int(refused.headers["Retry-After"])
    assert 1 <= retry_after <= 20  # a token every 20 s
    status = refused.json()
    assert status["kind"] == "Status" and status["apiVersion"] == "v1" and status["status"] == "Failure"
    assert status["reason"] == "TooManyRequests" and status["code"] == 429
    assert status["details"]["retryAfterSeconds"] == retry_after
    assert "rated" not in status["message"]  # the limit is named, never the user
    # Nothing of a refused request reaches the apiserver.
    before = len(world.api.requests.matching("/api/v1/namespaces/default/pods"))
    assert _get(world, "rated", PODS).status_code == 429
    assert len(world.api.requests.matching("/api/v1/namespaces/default/pods")) == before


def test_a_client_that_ignores_retry_after_cannot_make_the_refusals_the_load(world: World) -> None:
    """Asking again at once after each 429, on one keep-alive connection: each refusal is
    answered a second (``queue.refusal_delay``, the default) after its request arrived, so the
    connection asks about once a second instead of as fast as the gateway can refuse."""
    session = requests.Session()
    headers = {"Authorization": f"Bearer {world.tokens['hammer']}"}
    statuses: list[int] = []
    refused_took: list[float] = []
    began = time.monotonic()
    while time.monotonic() - began < 3.0 and len(statuses) < 1000:
        sent = time.monotonic()
        status = session.get(world.gw.url + PODS, headers=headers, verify=world.gw.ca_file, timeout=30).status_code
        statuses.append(status)
        if status == 429:
            refused_took.append(time.monotonic() - sent)
    session.close()
    assert statuses[0] == 200 and set(statuses[1:]) == {429}, statuses
    assert len(statuses) <= 5, f"{len(statuses)} requests in 3 s"  # one admitted, then about one a second
    assert min(refused_took) >= 0.9, refused_took


def test_the_bucket_holds_across_both_workers(world: World) -> None:
    # 30 requests at once, each on its own connection: both workers accept them. A bucket per
    # worker would let up to twice the burst through.
    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(lambda _: _get(world, "spread", PODS).status_code, range(30)))
    assert codes.count(200) in (6, 7), codes  # the burst, and at most one token refilled meanwhile
    assert codes.count(429) == 30 - codes.count(200)


def test_kubectl_waits_out_the_429s_and_succeeds(world: World) -> None:
    kubeconfig = world.gw.kubeconfig(world.tokens["kubectl-user"], world.tmp / "kubectl-user.kubeconfig",
                                     cluster=CLUSTER)
    before = _refusals(world, "kubectl-user")
    # A cold cache: discovery, then the list — more requests at once than the bucket holds.
    result = kubectl("get", "pods", "-o", "name", kubeconfig=kubeconfig, timeout=120, request_timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pod/web-1" in result.stdout
    assert wait_until(lambda: _refusals(world, "kubectl-user") > before, timeout=10), \
        "kubectl was never refused: the test did not exercise the limit"


def test_the_python_client_waits_out_the_429s(world: World) -> None:
    from kubernetes import client, config

    kubeconfig = world.gw.kubeconfig(world.tokens["pyclient"], world.tmp / "pyclient.kubeconfig", cluster=CLUSTER)
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core = client.CoreV1Api(api_client)
        started = time.monotonic()
        for _ in range(3):  # a bucket of one, a token every 2 s: the 2nd and 3rd wait
            assert "web-1" in [p.metadata.name for p in core.list_namespaced_pod("default").items]
        assert time.monotonic() - started >= 2
    finally:
        api_client.close()
    assert _refusals(world, "pyclient") >= 1


def test_a_user_cannot_hold_more_watches_than_its_cap(world: World) -> None:
    watch = f"{PODS}?watch=true&timeoutSeconds=60"
    short_watch = f"{PODS}?watch=true&timeoutSeconds=1"
    sessions = [requests.Session() for _ in range(6)]
    opened: list[requests.Response] = []
    try:
        for session in sessions:
            opened.append(session.get(world.gw.url + watch, stream=True, verify=world.gw.ca_file, timeout=30,
                                      headers={"Authorization": f"Bearer {world.tokens['watcher']}"}))
        codes = [r.status_code for r in opened]
        assert codes.count(200) == 3 and codes.count(429) == 3, codes
        refused = next(r for r in opened if r.status_code == 429)
        assert refused.json()["reason"] == "TooManyRequests" and refused.headers["Retry-After"] == "1"
        assert wait_until(lambda: world.api.open_watches == 3, timeout=15), world.api.open_watches
        # A watch that ends gives its place back.
        next(r for r in opened if r.status_code == 200).close()
        sessions[0].close()
        assert wait_until(lambda: _get(world, "watcher", short_watch).status_code == 200,
                          timeout=30)
    finally:
        for response in opened:
            response.close()
        for session in sessions:
            session.close()


def test_a_heavy_user_is_held_to_its_inflight_cap_while_a_light_one_is_served(world: World) -> None:
    slow = f"{TUNNEL}/__slow?seconds=0.5"
    world.api.slow_peak = 0
    stop = time.monotonic() + 6
    heavy_codes: list[int] = []
    lock = threading.Lock()

    def heavy() -> None:
        for _ in range(20):  # bounded in count and in time
            if time.monotonic() > stop:
                return
            code = _get(world, "heavy", slow, timeout=60).status_code
            with lock:
                heavy_codes.append(code)

    threads = [threading.Thread(target=heavy) for _ in range(24)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: world.api.slow_now >= 4, timeout=20)
        light = []
        for _ in range(5):
            started = time.monotonic()
            assert _get(world, "light", PODS).status_code == 200
            light.append(time.monotonic() - started)
    finally:
        for thread in threads:
            thread.join(90)
    # The heavy user's 24 connections never put more than its cap on the apiserver at once.
    assert world.api.slow_peak <= 4, world.api.slow_peak
    assert heavy_codes and set(heavy_codes) <= {200, 429}
    # The light user was served while the heavy user's requests waited in its line (24 at 4 at a
    # time, 0.5 s each: 3 s); a bound well under that line, generous for a loaded machine.
    assert max(light) < 2.0, light


def test_refusals_are_counted_per_limit_without_user_labels(world: World) -> None:
    status, body = world.gw.call("GET", "/metrics")
    assert status == 200
    text = body.decode()
    refused = {m.group(1): float(m.group(2))
               for m in re.finditer(r'^bcs_limits_refused_total\{limit="([a-z_]+)"\} ([0-9.e+]+)$', text, re.M)}
    assert refused.get("user_rate", 0) >= 1 and refused.get("user_long_running", 0) >= 1, refused
    for name in USERS:
        assert f'"{name}"' not in "\n".join(line for line in text.splitlines() if line.startswith("bcs_limits"))
    assert 'bcs_limits_capacity{bound="worker_seats"} 8.0' in text
    assert 'bcs_limits_capacity{bound="user_turn_after"} 2.0' in text  # the default
    # The gateway's own clients' bounds are configured in the same file and shown.
    assert 'bcs_limits_capacity{bound="upstream_idle_per_cluster"} 48.0' in text
    assert 'bcs_limits_capacity{bound="database_connections"} 3.0' in text
    assert 'bcs_limits_capacity{bound="database_overflow"} 2.0' in text
    assert 'bcs_limits_capacity{bound="agent_concurrent_dials"}' in text


def test_health_and_superusers_are_exempt(world: World) -> None:
    # The admin (a superuser) is never limited; nor are the probes.
    assert all(world.gw.call("GET", PODS)[0] == 200 for _ in range(3))
    answers = [requests.get(world.gw.url + "/healthz", verify=world.gw.ca_file, timeout=10).status_code
               for _ in range(20)]
    assert set(answers) == {200}
    assert json.loads(world.gw.call("GET", "/readyz")[1])
