"""A real gateway (``bcs-middleware serve --record on``) in front of the fake apiserver's terminal pod.

Two clusters on the same fake apiserver: :data:`CLUSTER` records ``on``, :data:`REQUIRED`
records ``required`` (``--record-cluster``). Recordings go to the directory store in the
gateway's data directory; audit events to ``audit.jsonl`` beside it. One worker, so its
memory can be read (``/proc``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.kube import kubectl_path

from .terminal_pod import TerminalPod

CLUSTER = "BCS-K8S-REC01"
REQUIRED = "BCS-K8S-REC02"
POD = {"metadata": {"name": "p", "namespace": "default"},
       "spec": {"containers": [{"name": "app", "image": "busybox", "tty": True, "stdin": True}]}}
#: kubectl that still runs exec/attach over SPDY (websockets became its default in 1.30).
SPDY_KUBECTL = next((v for v in ("1.29", "1.28", "1.27") if kubectl_path(v)), None)


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        api.create("pods", POD, "default")
        yield api


@pytest.fixture(scope="module")
def pod(apiserver: FakeAPIServer) -> Iterator[TerminalPod]:
    handler = TerminalPod(apiserver)
    apiserver.on_upgrade(handler)
    yield handler
    apiserver.on_upgrade(None)


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    args = ["--record", "on", "--record-cluster", f"{REQUIRED}=required", "--audit-log", str(data / "audit.jsonl")]
    with served_gateway(data, args=args, workers=1) as gw:
        for cluster in (CLUSTER, REQUIRED):
            register_cluster(gw, cluster, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def alice(gateway: Gateway) -> str:
    """May exec on both clusters and read their recordings (edit)."""
    token = gateway.user("alice-rec")
    for cluster in (CLUSTER, REQUIRED):
        gateway.grant("alice-rec", "edit", cluster)
    return token


@pytest.fixture(scope="module")
def bob(gateway: Gateway) -> str:
    """May exec on CLUSTER (view) and read no recording."""
    token = gateway.user("bob-rec")
    gateway.grant("bob-rec", "view", CLUSTER)
    return token


@pytest.fixture(scope="module")
def kubeconfigs(gateway: Gateway, alice: str, bob: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("kc")
    return {
        "alice": gateway.kubeconfig(alice, folder / "alice", cluster=CLUSTER),
        "alice-required": gateway.kubeconfig(alice, folder / "alice-required", cluster=REQUIRED),
        "bob": gateway.kubeconfig(bob, folder / "bob", cluster=CLUSTER),
    }
