"""The webhook backend against a real HTTPS receiver, through the gateway's outbound transport:
kube-apiserver's truncation, what is acknowledged when a batch fails part-way, the kubeconfig."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trustme
import yaml

from bcs_middleware.audit.export.backend import DeliveryFailed, Outcome
from bcs_middleware.audit.export.truncate import TRUNCATED, TruncateLimits, fit, split
from bcs_middleware.audit.export.webhook import WebhookBackend, WebhookTarget, load_webhook_config
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.outbound.transport import PooledTransport
from tests.audit.export.receivers import WebhookReceiver, webhook_receiver


def event(number: int, *, level: str = "RequestResponse", body: int = 0) -> bytes:
    document: dict = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level, "auditID": str(number),
                      "stage": "ResponseComplete"}
    if body:
        document["requestObject"] = {"data": "r" * body}
        document["responseObject"] = {"data": "s" * body}
    return json.dumps(document).encode()


def backend(receiver: WebhookReceiver, truncate: TruncateLimits | None = None) -> WebhookBackend:
    target = WebhookTarget(server=f"https://localhost:{receiver.port}/audit",
                           ca_pem=receiver.ca.cert_pem.bytes().decode(), token=receiver.token)
    return WebhookBackend(target, transport=PooledTransport(connect_timeout=2, read_timeout=5), timeout=5,
                          truncate=truncate)


def test_an_event_too_large_loses_its_objects_and_says_so_as_kube_apiserver() -> None:
    small = fit(event(1, body=1000), 600)
    assert small is not None
    shrunk = json.loads(small)
    assert "requestObject" not in shrunk and "responseObject" not in shrunk
    assert shrunk["annotations"] == {TRUNCATED: "true"}
    assert fit(event(2, level="Metadata", body=1000), 600) is None  # nothing to cut: dropped
    assert fit(event(3), 600) == event(3)  # within the limit: untouched


def test_batches_split_by_size_keep_order_and_a_large_item_goes_alone() -> None:
    assert split([10, 10, 10, 50, 10], 25) == [2, 1, 1, 1]
    assert split([], 25) == []


def test_truncation_sends_parts_within_the_limits_and_counts_what_it_dropped() -> None:
    with webhook_receiver() as receiver:
        limits = TruncateLimits(max_batch_size=400, max_event_size=400)
        records = [event(0), event(1, body=2000), event(2, level="Metadata", body=2000), event(3), event(4)]
        outcome = backend(receiver, limits).process(records)
        assert outcome == Outcome(delivered=4, dropped=1)
        got = receiver.received()
        assert [e["auditID"] for e in got] == ["0", "1", "3", "4"]
        assert got[1]["annotations"] == {TRUNCATED: "true"}
        assert receiver.posts >= 2  # split: no part passes max_batch_size


def test_a_failure_part_way_acknowledges_only_the_parts_the_receiver_took() -> None:
    with webhook_receiver() as receiver:
        limits = TruncateLimits(max_batch_size=300, max_event_size=300)
        sender = backend(receiver, limits)
        records = [event(n) for n in range(6)]
        original = sender._post
        calls = []

        def flaky(events: list[bytes]) -> None:
            calls.append(len(events))
            if len(calls) == 2:
                receiver.down()
            original(events)

        sender._post = flaky  # type: ignore[method-assign]
        with pytest.raises(DeliveryFailed) as failure:
            sender.process(records)
        assert failure.value.outcome == Outcome(delivered=calls[0])
        assert len(receiver.received()) == calls[0]


@pytest.mark.parametrize(("status", "retried"), [
    pytest.param(503, True, id="unavailable"), pytest.param(429, True, id="too-many"),
    pytest.param(401, True, id="unauthorized-misconfigured"), pytest.param(400, False, id="bad-request"),
    pytest.param(413, False, id="too-large"),
])
def test_what_a_receiver_answers_decides_retry_or_drop(status: int, retried: bool) -> None:
    with webhook_receiver() as receiver:
        receiver.status = status
        sender = backend(receiver)
        if retried:
            with pytest.raises(DeliveryFailed) as failure:
                sender.process([event(0), event(1)])
            assert failure.value.outcome == Outcome()
        else:
            assert sender.process([event(0), event(1)]) == Outcome(dropped=2)


def test_the_token_goes_only_in_authorization_and_a_wrong_one_is_retried() -> None:
    with webhook_receiver() as receiver:
        target = WebhookTarget(server=f"https://localhost:{receiver.port}/audit",
                               ca_pem=receiver.ca.cert_pem.bytes().decode(), token="not-the-token-00000000")
        sender = WebhookBackend(target, transport=PooledTransport(), timeout=5)
        with pytest.raises(DeliveryFailed) as failure:
            sender.process([event(0)])
        assert "not-the-token" not in str(failure.value)
        assert "not-the-token" not in repr(target)


def test_a_receiver_certificate_from_another_ca_is_refused() -> None:
    with webhook_receiver() as receiver:
        target = WebhookTarget(server=f"https://localhost:{receiver.port}/audit",
                               ca_pem=trustme.CA().cert_pem.bytes().decode(), token=receiver.token)
        with pytest.raises(DeliveryFailed, match=r"(?i)certificate|tls"):
            WebhookBackend(target, transport=PooledTransport(), timeout=5).process([event(0)])
        assert receiver.posts == 0


def _kubeconfig(path: Path, cluster: dict, user: dict) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hook",
        "clusters": [{"name": "other", "cluster": {"server": "https://other.example:1"}},
                     {"name": "hook", "cluster": cluster}],
        "users": [{"name": "hook", "user": user}],
        "contexts": [{"name": "hook", "context": {"cluster": "hook", "user": "hook"}}],
    }))
    return path


def test_the_kubeconfig_of_kube_apiserver_reads_as_it_does(tmp_path: Path) -> None:
    ca = trustme.CA()
    client = ca.issue_cert("gateway")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem.bytes())
    path = _kubeconfig(tmp_path / "hook.kubeconfig",
                       {"server": "https://siem.example:8443/k8s-audit", "certificate-authority": "ca.crt",
                        "tls-server-name": "siem"},
                       {"client-certificate-data": base64.b64encode(client.cert_chain_pems[0].bytes()).decode(),
                        "client-key-data": base64.b64encode(client.private_key_pem.bytes()).decode()})
    target = load_webhook_config(path, secrets_dir=tmp_path / "secrets")
    assert target.server == "https://siem.example:8443/k8s-audit"
    assert target.ca_pem == ca.cert_pem.bytes().decode()
    assert target.server_name == "siem"
    assert target.client_cert is not None
    for file in target.client_cert:
        assert Path(file).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("cluster", "message"), [
    pytest.param({"server": "https://siem.example", "insecure-skip-tls-verify": True}, "insecure-skip-tls-verify",
                 id="no-verify"),
    pytest.param({"server": "http://siem.example/audit"}, "https://", id="plain-http"),
    pytest.param({"server": "ftp://siem.example"}, "https://", id="not-http"),
    pytest.param({"server": "https://siem.example", "certificate-authority": "missing.crt"}, "missing.crt",
                 id="missing-ca"),
])
def test_a_kubeconfig_that_would_weaken_tls_or_is_broken_is_refused(tmp_path: Path, cluster: dict,
                                                                    message: str) -> None:
    path = _kubeconfig(tmp_path / "hook.kubeconfig", cluster, {"token": "t" * 32})
    with pytest.raises(ConfigError, match=message):
        load_webhook_config(path, secrets_dir=None)


def test_plain_http_is_accepted_only_to_loopback(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "hook.kubeconfig", {"server": "http://127.0.0.1:9000/audit"}, {})
    assert load_webhook_config(path, secrets_dir=None).server == "http://127.0.0.1:9000/audit"
