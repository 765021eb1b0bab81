"""The per-cluster discovery cache, through a real ``serve`` and real kubectl: cold kubectl runs
reach the apiserver's discovery once, another cluster never gets the first one's documents,
new credentials drop them, and a stale entry is revalidated with the apiserver's ETag."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import trustme

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLI, SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.kube import kubectl, write_kubeconfig
from tests.support.polling import wait_until

CLUSTER = "disco-c1"
OTHER = "disco-c2"
DISCOVERY = ("/api", "/apis")


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    alice: str
    tmp: Path
    register_token: str


def _world(tmp: Path, ttl: str) -> Iterator[World]:
    limits = tmp / "limits.yaml"
    limits.write_text(f"discovery_cache: {{ttl: {ttl}}}\n")
    data = tmp / "data"
    ini = gateway_ini(tmp / "gateway.ini", data, limits_config=str(limits), cluster_cache_ttl="0.2s")
    with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(data, args=["--config", str(ini)], workers=1) as gw:
        register_token = register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
        alice = gw.user("alice")
        gw.grant("alice", "view", cluster=CLUSTER)
        api.store.create("pods", {"metadata": {"name": "web-1", "namespace": "default"},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        yield World(gw, api, alice, tmp, register_token)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from _world(tmp_path_factory.mktemp("discovery-cache"), "10m")


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from _world(tmp_path_factory.mktemp("discovery-revalidate"), "300ms")


def _discovery_requests(api: FakeAPIServer) -> int:
    """Discovery requests the gateway sent for a user (the kube-agent's own reads of the
    apiserver carry no ``Impersonate-User``)."""
    return sum(1 for r in api.requests if "Impersonate-User" in r.headers and (
        r.path in DISCOVERY or (r.path.startswith(("/api/v1", "/apis/")) and r.path.count("/") <= 3
        and "namespaces" not in r.path)))


def _get_pods(world: World, cluster: str = CLUSTER) -> None:
    kubeconfig = world.gw.kubeconfig(world.alice, world.tmp / f"{cluster}.kubeconfig", cluster=cluster)
    result = kubectl("get", "pods", "-o", "name", kubeconfig=kubeconfig, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pod/web-1" in result.stdout


def test_cold_kubectl_runs_reach_discovery_once(world: World) -> None:
    _get_pods(world)
    first = _discovery_requests(world.api)
    assert first >= 2  # /api and /apis at least
    lists = len(world.api.requests.matching("/api/v1/namespaces/default/pods"))
    for _ in range(3):  # each kubectl has a home (and a discovery cache) of its own
        _get_pods(world)
    assert _discovery_requests(world.api) == first
    assert len(world.api.requests.matching("/api/v1/namespaces/default/pods")) == lists + 3  # only discovery is cached


def test_another_cluster_never_gets_the_first_ones_documents(world: World) -> None:
    _get_pods(world)
    before = _discovery_requests(world.api)
    register_cluster(world.gw, OTHER, server_url=world.api.url, ca_pem=world.api.ca_pem)
    world.gw.grant("alice", "view", cluster=OTHER)
    _get_pods(world, OTHER)
    assert _discovery_requests(world.api) > before


def test_new_credentials_drop_the_clusters_documents(world: World) -> None:
    assert _api_answer(world)[0] == 200
    before = _discovery_requests(world.api)
    assert _api_answer(world)[0] == 200 and _discovery_requests(world.api) == before  # served from the cache
    # The kube-agent reports new credentials: the apiserver's CA in a bundle with another one
    # (a CA rotation), so the cluster's requests now go out with other trust.
    _report(world, world.api.ca_pem + trustme.CA().cert_pem.bytes().decode())
    assert wait_until(lambda: _api_answer(world)[0] == 200 and _discovery_requests(world.api) > before, timeout=30)


def _report(world: World, ca_pem: str) -> None:
    token = world.register_token
    kubeconfig = write_kubeconfig(world.tmp / "agent.kubeconfig", server=world.api.url, token=SA_TOKEN,
                                  ca_pem=ca_pem)
    agent = subprocess.run(
        [CLI, "kube-agent", "--bke-address", world.gw.url, "--cluster-id", CLUSTER, "--kubeconfig",
         str(kubeconfig), "--once"],
        env={**os.environ, "REGISTER_TOKEN": token, "SERVER_CERT": Path(world.gw.ca_file).read_text()},
        capture_output=True, text=True, timeout=60, check=False)
    assert agent.returncode == 0, agent.stderr


def _api_answer(world: World, headers: dict[str, str] | None = None) -> tuple[int, requests.Response]:
    response = requests.get(f"{world.gw.url}/tunnels/clusters/{CLUSTER}/api", verify=world.gw.ca_file, timeout=30,
                            headers={"Authorization": f"Bearer {world.alice}", **(headers or {})})
    return response.status_code, response


def test_a_stale_entry_is_revalidated_with_the_etag(short: World) -> None:
    status, first = _api_answer(short)
    assert status == 200
    etag = first.headers["ETag"]
    asked = [r for r in short.api.requests if r.path == "/api"]
    assert len(asked) == 1 and asked[0].headers.get("If-None-Match") is None
    # Once the entry is older than its ttl, the apiserver is asked whether it changed.
    assert wait_until(lambda: _api_answer(short)[0] == 200 and any(
        r.path == "/api" and r.headers.get("If-None-Match") == etag for r in short.api.requests), timeout=30)
    # The apiserver said 304; the client still got the whole document.
    status, again = _api_answer(short)
    assert status == 200 and again.content == first.content
    assert json.loads(again.content)["kind"] == "APIVersions"
    # A client's own If-None-Match is answered from the entry.
    status, not_modified = _api_answer(short, {"If-None-Match": etag})
    assert status == 304 and not not_modified.content
    assert hashlib.sha256(first.content).hexdigest() == hashlib.sha256(again.content).hexdigest()


def test_cache_counts_are_metrics(world: World) -> None:
    status, body = world.gw.call("GET", "/metrics")
    text = body.decode()
    assert status == 200
    assert 'bcs_discovery_cache_lookups_total{result="hit"}' in text
    assert 'bcs_discovery_cache_lookups_total{result="miss"}' in text
