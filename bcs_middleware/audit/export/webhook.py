"""The audit webhook backend: ``POST`` an ``audit.k8s.io/v1`` ``EventList`` as kube-apiserver does.

Configured by a kubeconfig file, as kube-apiserver's ``--audit-webhook-config-file``
(``staging/src/k8s.io/apiserver/plugin/pkg/audit/webhook/webhook.go``): the current
context's (else the only) cluster gives ``server`` and ``certificate-authority[-data]``
(and ``tls-server-name``), its user ``client-certificate[-data]``/``client-key[-data]``
or ``token``/``tokenFile``. TLS is verified (``insecure-skip-tls-verify`` is refused);
plain ``http://`` is accepted only for a loopback address.

Every call goes through the gateway's outbound stack (timeouts, the upstream address
policy, verified TLS, pooled keep-alive connections). With truncation on
(:mod:`.truncate`), events are cut to ``max_event_size`` and a batch is sent in parts of at
most ``max_batch_size`` bytes, each part acknowledged once it is accepted — so a retry
never sends a part again that the receiver took.

Any ``2xx`` is an acceptance. Connection failures, timeouts, ``5xx``, ``429``, ``408``
and the answers of a misconfigured receiver (``401``, ``403``, ``404``) are retried
(:class:`~.backend.DeliveryFailed`); any other ``4xx`` is the receiver refusing these events
for good: they are dropped and counted, as retrying could never succeed.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...core import environ as env
from ...core.bodies import parse_yaml
from ...core.errors import ConfigError
from ...outbound.causes import OutboundError
from ...outbound.transport import Transport
from .backend import DeliveryFailed, Outcome
from .truncate import TruncateLimits, fit, split

log = logging.getLogger(__name__)

__all__ = ["WebhookBackend", "WebhookTarget", "load_webhook_config"]

_LIST_HEAD = b'{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":['
_LIST_TAIL = b"]}"
#: Statuses retried: the receiver is overloaded, down, or not configured for us yet.
_RETRIED = frozenset({401, 403, 404, 408, 429})
#: An answer's body is read (and dropped) up to this much, so its connection can be reused.
_MAX_ANSWER = 64 * 1024


@dataclass(frozen=True)
class WebhookTarget:
    """Where and as whom the events go (from the kubeconfig)."""

    server: str
    ca_pem: str | None = None
    server_name: str | None = None
    token: str | None = field(default=None, repr=False)
    client_cert: tuple[str, str] | None = None


def _pick(items: Any, name: str | None, what: str, path: Path) -> dict[str, Any]:
    if not isinstance(items, list) or not items:
        raise ConfigError(f"audit webhook config {path}: no {what}s")
    for item in items:
        if isinstance(item, dict) and (name is None or item.get("name") == name):
            body = item.get(what)
            if isinstance(body, dict):
                return body
    raise ConfigError(f"audit webhook config {path}: no {what} named {name!r}" if name
                      else f"audit webhook config {path}: no usable {what}")


def _pem(entry: dict[str, Any], key: str, base: Path, path: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise ConfigError(f"audit webhook config {path}: {key}-data is not base64") from None
    file = entry.get(key)
    if file:
        target = Path(file) if Path(file).is_absolute() else base / file
        try:
            return target.read_bytes()
        except OSError as exc:
            raise ConfigError(f"audit webhook config {path}: {key} {target}: {exc.strerror}") from None
    return None


def load_webhook_config(path: str | Path, *, secrets_dir: Path | None) -> WebhookTarget:
    """The kubeconfig at ``path`` → :class:`WebhookTarget` (:class:`ConfigError` names the field).

    :param secrets_dir: where an inline client certificate and key are written (0600) for
        the TLS stack, which loads them from files; ``None``: only file paths are accepted.
    """
    path = Path(path)
    try:
        document = parse_yaml(path.read_text(), what=f"audit webhook config {path}")
    except OSError as exc:
        raise ConfigError(f"audit webhook config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"audit webhook config {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"audit webhook config {path}: not a kubeconfig")
    current = document.get("current-context")
    context = _pick(document.get("contexts"), current, "context", path) if document.get("contexts") else {}
    cluster = _pick(document.get("clusters"), context.get("cluster"), "cluster", path)
    users = document.get("users")
    user = _pick(users, context.get("user"), "user", path) if users else {}
    server = str(cluster.get("server") or "")
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"audit webhook config {path}: server must be an https:// URL")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigError(f"audit webhook config {path}: server must be https:// (http only to a loopback address)")
    if cluster.get("insecure-skip-tls-verify"):
        raise ConfigError(f"audit webhook config {path}: insecure-skip-tls-verify is refused; give the "
                          "receiver's CA in certificate-authority")
    base = path.parent
    ca = _pem(cluster, "certificate-authority", base, path)
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token_path = Path(user["tokenFile"]) if Path(user["tokenFile"]).is_absolute() else base / user["tokenFile"]
        try:
            token = token_path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"audit webhook config {path}: tokenFile {token_path}: {exc.strerror}") from None
    client_cert = _client_cert(user, base, path, secrets_dir)
    return WebhookTarget(server=server.rstrip("/") if parts.path in ("", "/") else server,
                         ca_pem=ca.decode("ascii", "replace") if ca else None,
                         server_name=cluster.get("tls-server-name") or None,
                         token=str(token) if token else None, client_cert=client_cert)


def _client_cert(user: dict[str, Any], base: Path, path: Path,
                 secrets_dir: Path | None) -> tuple[str, str] | None:
    if not (user.get("client-certificate") or user.get("client-certificate-data")):
        return None
    if user.get("client-certificate") and user.get("client-key") and not user.get("client-certificate-data"):
        cert, key = (Path(user[k]) if Path(user[k]).is_absolute() else base / user[k]
                     for k in ("client-certificate", "client-key"))
        for file in (cert, key):
            if not file.is_file():
                raise ConfigError(f"audit webhook config {path}: no such file {file}")
        return str(cert), str(key)
    cert_pem, key_pem = _pem(user, "client-certificate", base, path), _pem(user, "client-key", base, path)
    if not cert_pem or not key_pem:
        raise ConfigError(f"audit webhook config {path}: a client certificate needs its client-key")
    if secrets_dir is None:
        raise ConfigError(f"audit webhook config {path}: inline client-certificate-data needs a data directory")
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = []
    for name, pem in (("webhook-client.crt", cert_pem), ("webhook-client.key", key_pem)):
        target = secrets_dir / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        files.append(str(target))
    return files[0], files[1]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebhookBackend:
    """``POST`` batches of events to the webhook (see the module docs).

    :param target: the receiver.
    :param transport: the process's outbound transport.
    :param timeout: seconds one ``POST`` may take, answer included.
    :param truncate: truncation limits, ``None``: off (kube-apiserver's default).
    """

    name = "webhook"

    def __init__(self, target: WebhookTarget, *, transport: Transport, timeout: float = 30.0,
                 truncate: TruncateLimits | None = None) -> None:
        self.target = target
        self.transport = transport
        self.timeout = timeout
        self.truncate = truncate
        parts = urlsplit(target.server)
        self._upstream = env.Upstream(
            base_urls=(f"{parts.scheme}://{parts.netloc}",), path=parts.path or "/", query=parts.query,
            ca_pem=target.ca_pem, server_name=target.server_name, client_cert=target.client_cert,
            name="audit webhook",
        )
        self._headers = [("Content-Type", "application/json"), ("Accept", "application/json")]
        if target.token:
            self._headers.append(("Authorization", f"Bearer {target.token}"))

    def process(self, records: Sequence[bytes]) -> Outcome:
        done = Outcome()
        for consumed, events in self._parts(records):
            if not events:
                done += Outcome(dropped=consumed)
                continue
            try:
                self._post(events)
            except Refused as refusal:
                log.warning("%s: %d events dropped", refusal, consumed)
                done += Outcome(dropped=consumed)
                continue
            except DeliveryFailed as failure:
                raise DeliveryFailed(str(failure), done) from None
            done += Outcome(delivered=len(events), dropped=consumed - len(events))
        return done

    def _parts(self, records: Sequence[bytes]) -> list[tuple[int, list[bytes]]]:
        """``(records consumed, events to send)`` in order: the whole batch, or with truncation
        on, parts within the size limits (an event too large is consumed by the next part)."""
        if self.truncate is None:
            return [(len(records), list(records))]
        fitted: list[bytes] = []
        skipped: list[int] = []  # per fitted event: records dropped just before it
        dropped = 0
        for record in records:
            small = fit(record, self.truncate.max_event_size)
            if small is None:
                log.warning("audit webhook: an event of %d bytes is larger than the maximum event size "
                            "%d even without its objects: dropped", len(record), self.truncate.max_event_size)
                dropped += 1
                continue
            fitted.append(small)
            skipped.append(dropped)
            dropped = 0
        parts: list[tuple[int, list[bytes]]] = []
        start = 0
        for count in split([len(r) for r in fitted], self.truncate.max_batch_size):
            parts.append((count + sum(skipped[start:start + count]), fitted[start:start + count]))
            start += count
        if dropped:
            parts.append((dropped, []))
        return parts

    def _post(self, events: list[bytes]) -> None:
        body = [_LIST_HEAD, b",".join(events), _LIST_TAIL]
        try:
            response = self.transport.send(self._upstream, "POST", list(self._headers), body,
                                           sum(map(len, body)), timeout=self.timeout)
        except OutboundError as cause:
            raise DeliveryFailed(f"audit webhook: {cause}") from None
        try:
            status = response.status
            _drain(response)
        except OutboundError as cause:
            raise DeliveryFailed(f"audit webhook: reading the answer: {cause}") from None
        finally:
            response.release_conn()
        if 200 <= status < 300:
            return
        if status >= 500 or status in _RETRIED:
            raise DeliveryFailed(f"audit webhook answered HTTP {status}")
        raise Refused(f"audit webhook answered HTTP {status}", len(events))

    def shutdown(self) -> None:
        """Nothing of its own: connections belong to the shared transport."""


class Refused(DeliveryFailed):
    """The receiver refused these events for good (a ``4xx`` other than the retried ones)."""

    def __init__(self, message: str, count: int) -> None:
        super().__init__(message)
        self.count = count


def _drain(response: Any) -> None:
    size = 0
    while piece := response.read1(65536):
        size += len(piece)
        if size > _MAX_ANSWER:
            response.close()
            return


def event_list(records: Sequence[bytes]) -> dict[str, Any]:
    """The ``EventList`` :meth:`WebhookBackend.process` sends for ``records`` (for tests and tools)."""
    document: dict[str, Any] = json.loads(_LIST_HEAD + b",".join(records) + _LIST_TAIL)
    return document
