"""The gateway must not connect where a cluster owner points it, nor tell them what listens there.

Any user can register a cluster and report its apiserver addresses with the register token. The
attacker here is such a user (``mallory``): they report addresses that are the gateway's own port,
the metadata service, link-local/unspecified/multicast/broadcast addresses, and numeric spellings
of an address the operator denied — and then use the tunnel. Each attempt must be refused before a
connection is made (trap listeners on 127.0.0.x / ::1 count the connections they accept), and a
non-superuser must read one message for every failure to reach an apiserver, so the gateway cannot
serve as a port scanner; a superuser reads the detail.

Two real gateways (``bcs-middleware serve``): ``denying`` has ``--upstream-deny 127.0.0.2/32,::1``
(the fake apiserver on 127.0.0.1 stays reachable); ``allowing`` has ``--upstream-allow 127.0.0.0/8
--upstream-deny 127.0.0.1/32`` (deny wins; an allow list means "only these").
"""

from __future__ import annotations

import http.client
import itertools
import json
import ssl
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from bcs_middleware.clusters.reader import cluster_request
from bcs_middleware.compose.gateway import config_from_options
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.core.records import CredentialRecord
from bcs_middleware.outbound.addresses import AddressPolicy
from bcs_middleware.outbound.causes import AddressRefused
from bcs_middleware.outbound.transport import PooledTransport
from bcs_middleware.rbac.kube import BindingClient, KubeError
from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLI, SA_TOKEN, Gateway, served_gateway
from tests.support.polling import wait_until
from tests.support.servers import TrapListener as Trap
from tests.support.servers import free_port

UNREACHABLE = "cannot reach the cluster's apiserver"
_ids = itertools.count()


@pytest.fixture(scope="module")
def traps() -> Iterator[dict[str, Trap]]:
    made = {name: Trap(host) for name, host in
            (("v4", "127.0.0.1"), ("denied", "127.0.0.2"), ("other", "127.0.0.3"), ("v6", "::1"))}
    made["http"] = Trap("127.0.0.1", answer=b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                                           b"Connection: close\r\n\r\n")
    yield made
    for trap in made.values():
        trap.close()


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def foreign_apiserver() -> Iterator[FakeAPIServer]:
    """A TLS server whose certificate chains to a CA the cluster did not report."""
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


def _attacker(gw: Gateway) -> str:
    return gw.user(f"mallory-{next(_ids)}")


@pytest.fixture(scope="module")
def denying(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    with served_gateway(tmp_path_factory.mktemp("denying"),
                        args=["--upstream-deny", "127.0.0.2/32,::1"]) as gw:
        yield gw, _attacker(gw)
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def allowing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    with served_gateway(tmp_path_factory.mktemp("allowing"),
                        args=["--upstream-allow", "127.0.0.0/8", "--upstream-deny", "127.0.0.1/32"]) as gw:
        yield gw, _attacker(gw)


def report(gw: Gateway, token: str, server_addresses: str, ca_pem: str, *, refused_ip: bool = False) -> str:
    """As ``token``'s user: create a cluster, take its register token, report these addresses.

    ``refused_ip``: the address is an IP (in any spelling) the policy refuses, so reporting it is a
    400 naming the field. It is then written to the store directly — as a gateway keeps addresses
    reported before its policy was configured — so the tunnel's own check can be attacked too.
    """
    cluster_id = f"BCS-K8S-AP{next(_ids):03d}"
    gw.json("POST", "/rest/clusters/bcs", token=token,
            body={"id": cluster_id, "project_id": "p1", "cluster_type": "k8s"})
    register = gw.json("POST", f"/rest/clusters/{cluster_id}/register_tokens", token=token)["token"]
    status, body = gw.call("PUT", f"/rest/clusters/{cluster_id}/credentials", token=register,
                           body={"server_addresses": server_addresses, "cacert_data": ca_pem,
                                 "user_token": SA_TOKEN})
    if not refused_ip:
        assert status == 200, body
        return cluster_id
    assert status == 400, body
    assert json.loads(body)["message"].startswith("server_addresses: the gateway does not connect to "), body
    store = open_store(None, data_dir=gw.data, migrate=False)
    try:
        store.put_credentials(cluster_id, server_addresses=[server_addresses], cacert_pem=ca_pem, user_token=SA_TOKEN)
    finally:
        store.db.dispose()
    return cluster_id


def tunnel(gw: Gateway, token: str, cluster_id: str) -> tuple[int, bytes]:
    return gw.call("GET", f"/tunnels/clusters/{cluster_id}/version", token=token)


def assert_refused_by_policy(gw: Gateway, token: str, cluster_id: str, why: str, traps: Iterable[Trap] = ()) -> None:
    """No trap saw a connection; the user reads the one message; the superuser reads that the policy
    refused it, and why."""
    traps = list(traps)
    before = [trap.accepted for trap in traps]
    status, body = tunnel(gw, token, cluster_id)
    assert [trap.accepted for trap in traps] == before, "the gateway connected"
    assert status == 502, body
    assert json.loads(body)["message"] == UNREACHABLE
    status, body = tunnel(gw, gw.admin, cluster_id)
    assert status == 502, body
    status_doc = json.loads(body)
    assert status_doc["details"]["causes"][0]["reason"] == "UPSTREAM_ADDRESS_REFUSED", status_doc
    assert "address policy" in status_doc["message"] and why in status_doc["message"], status_doc


@pytest.mark.parametrize(("address", "why"), [
    pytest.param("https://169.254.169.254", "link-local", id="metadata-service"),
    pytest.param("https://[::ffff:169.254.169.254]", "link-local", id="metadata-service-v4-mapped"),
    pytest.param("https://[fe80::1]:6443", "link-local", id="ipv6-link-local"),
    pytest.param("https://224.0.0.1", "multicast", id="multicast"),
    pytest.param("https://[ff02::1]", "multicast", id="ipv6-multicast"),
    pytest.param("https://255.255.255.255", "broadcast", id="broadcast"),
    pytest.param("https://0.0.0.0:{v4}", "unspecified", id="unspecified-reaches-loopback"),
    pytest.param("https://0:{v4}", "unspecified", id="unspecified-as-zero"),
    pytest.param("https://[::]:{v6}", "unspecified", id="ipv6-unspecified"),
    pytest.param("https://[::ffff:0.0.0.0]:{v4}", "unspecified", id="unspecified-v4-mapped"),
])
def test_addresses_refused_by_default_are_never_connected(denying: tuple[Gateway, str], traps: dict[str, Trap],
                                                          apiserver: FakeAPIServer, address: str, why: str) -> None:
    gw, mallory = denying
    cluster_id = report(gw, mallory, address.format(v4=traps["v4"].port, v6=traps["v6"].port), apiserver.ca_pem,
                        refused_ip=True)
    assert_refused_by_policy(gw, mallory, cluster_id, why, traps.values())


@pytest.mark.parametrize("host", [
    pytest.param("127.0.0.1", id="loopback"),
    pytest.param("localhost", id="by-name"),
    pytest.param("0x7f000001", id="hex"),
    pytest.param("2130706433", id="decimal"),
    pytest.param("127.1", id="short"),
    pytest.param("[::ffff:127.0.0.1]", id="v4-mapped"),
])
def test_the_gateways_own_port_is_refused_in_every_worker(denying: tuple[Gateway, str], host: str) -> None:
    gw, mallory = denying
    # The gateway's own CA: were it connected, TLS would verify and the gateway would call itself.
    cluster_id = report(gw, mallory, f"https://{host}:{gw.server.port}", Path(gw.ca_file).read_text(),
                        refused_ip=host != "localhost")
    for _ in range(4):  # a fresh connection each time: both workers answer some of them
        assert_refused_by_policy(gw, mallory, cluster_id, "own listening socket")


@pytest.mark.parametrize("host", [
    pytest.param("127.0.0.2", id="as-configured"),
    pytest.param("0x7f000002", id="hex"),
    pytest.param("2130706434", id="decimal"),
    pytest.param("017700000002", id="octal"),
    pytest.param("127.2", id="short"),
    pytest.param("[::ffff:127.0.0.2]", id="v4-mapped"),
    pytest.param("[::ffff:7f00:2]", id="v4-mapped-hex"),
])
def test_a_denied_network_cannot_be_reached_by_another_spelling(denying: tuple[Gateway, str], traps: dict[str, Trap],
                                                                apiserver: FakeAPIServer, host: str) -> None:
    gw, mallory = denying
    trap = traps["denied"]
    cluster_id = report(gw, mallory, f"https://{host}:{trap.port}", apiserver.ca_pem, refused_ip=True)
    assert_refused_by_policy(gw, mallory, cluster_id, "denied by 127.0.0.2/32", [trap])


def test_configured_deny_leaves_other_loopback_addresses_reachable(denying: tuple[Gateway, str], traps: dict[str, Trap],
                                                                   apiserver: FakeAPIServer) -> None:
    gw, mallory = denying
    v6 = traps["v6"]
    assert_refused_by_policy(gw, mallory, report(gw, mallory, f"https://[::1]:{v6.port}", apiserver.ca_pem,
                                                 refused_ip=True), "denied by ::1/128", [v6])
    # The allowed case keeps working: the fake apiserver on 127.0.0.1 answers the user.
    status, body = tunnel(gw, mallory, report(gw, mallory, apiserver.url, apiserver.ca_pem))
    assert status == 200, body


def test_a_name_is_judged_by_the_addresses_it_resolves_to(allowing: tuple[Gateway, str], traps: dict[str, Trap],
                                                          apiserver: FakeAPIServer) -> None:
    gw, mallory = allowing
    v4, v6, other = traps["v4"], traps["v6"], traps["other"]
    # localhost is 127.0.0.1: inside the allowed 127.0.0.0/8, but denied, and deny wins.
    assert_refused_by_policy(gw, mallory, report(gw, mallory, f"https://localhost:{v4.port}", apiserver.ca_pem),
                             "denied by 127.0.0.1/32", [v4, v6])
    # An allow list means "only these": ::1 is loopback, allowed by default, but not listed.
    assert_refused_by_policy(gw, mallory, report(gw, mallory, f"https://[::1]:{v6.port}", apiserver.ca_pem,
                                                 refused_ip=True), "not in the allowed networks", [v4, v6])
    # An allowed address is connected (the trap is no apiserver: the user reads the one message).
    before_other = other.accepted
    status, body = tunnel(gw, mallory, report(gw, mallory, f"https://127.0.0.3:{other.port}", apiserver.ca_pem))
    assert status == 502 and json.loads(body)["message"] == UNREACHABLE
    assert other.accepted > before_other


def test_an_upgrade_request_is_refused_the_same_way(denying: tuple[Gateway, str], traps: dict[str, Trap],
                                                    apiserver: FakeAPIServer) -> None:
    gw, mallory = denying
    trap = traps["v4"]
    before = trap.accepted
    cluster_id = report(gw, mallory, f"https://0.0.0.0:{trap.port}", apiserver.ca_pem, refused_ip=True)
    ctx = ssl.create_default_context(cafile=gw.ca_file)
    conn = http.client.HTTPSConnection("localhost", gw.server.port, context=ctx, timeout=30)
    try:
        conn.request("POST", f"/tunnels/clusters/{cluster_id}/api/v1/namespaces/default/pods/p/exec?command=sh",
                     headers={"Authorization": f"Bearer {mallory}", "Connection": "Upgrade",
                              "Upgrade": "SPDY/3.1"})
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert trap.accepted == before, "the gateway connected"
    assert resp.status == 502, body
    assert json.loads(body)["message"] == UNREACHABLE


def test_a_user_reads_one_message_for_every_failure_to_reach_the_apiserver(
    denying: tuple[Gateway, str], traps: dict[str, Trap], apiserver: FakeAPIServer,
    foreign_apiserver: FakeAPIServer,
) -> None:
    gw, mallory = denying
    closed = free_port()
    addresses = {
        "closed port": f"https://127.0.0.1:{closed}",
        "plain HTTP port": f"https://127.0.0.1:{traps['http'].port}",
        "TLS with another CA": foreign_apiserver.url,
        "accepts and closes": f"https://127.0.0.3:{traps['other'].port}",
        "refused by policy": "https://169.254.169.254",
    }
    clusters = {cause: report(gw, mallory, address, apiserver.ca_pem, refused_ip=cause == "refused by policy")
                for cause, address in addresses.items()}
    answers = {cause: tunnel(gw, mallory, cluster_id) for cause, cluster_id in clusters.items()}
    assert len(set(answers.values())) == 1, answers
    status, body = next(iter(answers.values()))
    assert status == 502 and json.loads(body)["message"] == UNREACHABLE
    assert str(closed) not in body.decode() and "127.0.0" not in body.decode()
    # A superuser reads what went wrong.
    expected = {
        "closed port": "cannot connect",
        "plain HTTP port": "TLS handshake",
        "TLS with another CA": "did not verify",
        "accepts and closes": "TLS handshake",
        "refused by policy": "address policy",
    }
    for cause, cluster_id in clusters.items():
        status, body = tunnel(gw, gw.admin, cluster_id)
        assert status == 502 and expected[cause] in json.loads(body)["message"], (cause, body)


def test_the_detail_goes_to_the_log(denying: tuple[Gateway, str], apiserver: FakeAPIServer) -> None:
    gw, mallory = denying
    cluster_id = report(gw, mallory, "https://169.254.169.254", apiserver.ca_pem, refused_ip=True)
    status, _ = tunnel(gw, mallory, cluster_id)
    assert status == 502
    assert wait_until(lambda: f"cluster:{cluster_id}" in gw.server.output()
                      and "169.254.169.254 (link-local)" in gw.server.output(), 10), \
        "the refusal's detail was not logged"


# The other outbound calls to clusters share the transport's connect hook.

def _credentials(address: str, ca_pem: str) -> CredentialRecord:
    return CredentialRecord("c-policy", (address,), ca_pem, SA_TOKEN)


def test_admission_and_rbac_reads_of_a_cluster_obey_the_policy(traps: dict[str, Trap],
                                                               apiserver: FakeAPIServer) -> None:
    trap = traps["denied"]
    before = trap.accepted
    transport = PooledTransport(connect_timeout=2, address_policy=AddressPolicy(deny=["127.0.0.2/32"]))
    creds = _credentials(f"https://2130706434:{trap.port}", apiserver.ca_pem)
    with pytest.raises(AddressRefused):
        cluster_request(transport, creds, "GET", "/api/v1/namespaces/default")  # admission's reads
    assert trap.accepted == before, "the gateway connected"
    with pytest.raises(KubeError, match="address policy"):
        BindingClient(creds, transport).list_owned("ClusterRoleBinding", "a=b")  # the RBAC sync
    assert trap.accepted == before, "the gateway connected"


def test_the_rbac_service_gets_the_gateways_policy(tmp_path: Path) -> None:
    from bcs_middleware.rbac.service import build_service
    from bcs_middleware.store.sql import open_store

    source = tmp_path / "grants.json"
    source.write_text("{}")
    store = open_store(None, data_dir=tmp_path)
    try:
        policy = AddressPolicy(deny=["10.0.0.0/8"])
        service = build_service(store, source_file=str(source), address_policy=policy)
        assert service.transport.address_policy is policy  # type: ignore[attr-defined]
    finally:
        store.db.dispose()


def test_ini_options_are_cidr_lists_and_bad_ones_name_the_key(tmp_path: Path) -> None:
    config = config_from_options("app:gateway", {"data_dir": str(tmp_path), "upstream_deny": "127.0.0.0/8, ::1",
                                                 "upstream_allow": "10.0.0.0/8\n192.168.1.7"})
    assert config.outbound.deny == ("127.0.0.0/8", "::1/128")
    assert config.outbound.allow == ("10.0.0.0/8", "192.168.1.7/32")
    with pytest.raises(ConfigError, match="upstream_deny"):
        config_from_options("app:gateway", {"data_dir": str(tmp_path), "upstream_deny": "localhost"})


def test_serve_refuses_a_bad_network_flag(tmp_path: Path) -> None:
    import subprocess

    result = subprocess.run([CLI, "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{free_port()}",
                             "--upstream-deny", "127.0.0.0/33"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "upstream_deny" in result.stderr


def test_a_refused_address_fails_over_to_the_next(apiserver: FakeAPIServer) -> None:
    transport = PooledTransport(connect_timeout=2)
    creds = CredentialRecord("c-failover", ("https://169.254.169.254", apiserver.url), apiserver.ca_pem, SA_TOKEN)
    try:
        status, _, document = cluster_request(transport, creds, "GET", "/version")
    finally:
        transport.close()
    assert status == 200 and isinstance(document, dict)
    assert transport.connections_opened == 1


@pytest.mark.parametrize("addresses", [
    pytest.param("https://169.254.169.254", id="metadata-service"),
    pytest.param("https://10.0.0.1:6443;https://[fe80::1]", id="second-entry-link-local"),
    pytest.param("https://0x7f000002:6443", id="denied-in-hex"),
    pytest.param("https://[::ffff:127.0.0.2]:6443", id="denied-v4-mapped"),
])
def test_reporting_a_refused_ip_is_a_400_that_changes_nothing(denying: tuple[Gateway, str],
                                                             apiserver: FakeAPIServer, addresses: str) -> None:
    gw, mallory = denying
    cluster_id = report(gw, mallory, apiserver.url, apiserver.ca_pem)
    register = gw.json("GET", f"/rest/clusters/{cluster_id}/register_tokens", token=mallory)["token"]
    status, body = gw.call("PUT", f"/rest/clusters/{cluster_id}/credentials", token=register,
                           body={"server_addresses": addresses, "cacert_data": apiserver.ca_pem,
                                 "user_token": SA_TOKEN})
    assert status == 400, body
    assert json.loads(body)["message"].startswith("server_addresses: "), body
    status, body = tunnel(gw, mallory, cluster_id)  # still the reported apiserver
    assert status == 200, body
