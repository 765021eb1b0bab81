"""One gateway (real ``bcs-middleware serve``: gunicorn, HTTPS) in front of a fake apiserver.

The cluster is registered end to end the way an operator does it: REST calls
create the cluster and its register token, and the real ``kube-agent`` reports
the fake apiserver's credentials (from a kubeconfig) to the gateway.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import (
    ADMIN,
    CLI,
    CLUSTER,
    SA_TOKEN,
    Gateway,
    register_cluster,
    served_gateway,
    short_admission_refresh,
)

__all__ = ["ADMIN", "CLI", "CLUSTER", "SA_TOKEN", "Gateway"]


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    with served_gateway(data, args=short_admission_refresh(data)) as gw:
        register_token = register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    # Read after the server stopped: each worker writes its queued access lines at exit.
    output = gw.server.output()
    assert SA_TOKEN not in output and register_token not in output
