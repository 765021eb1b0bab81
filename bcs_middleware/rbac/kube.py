"""A small JSON client for one cluster's RBAC bindings, over the tunnel's pooled transport.

It acts as the cluster's own service account (the credentials its kube-agent
reported), verifies TLS against the reported CA, bounds every answer's size and
relies on the transport's connect/read timeouts for time.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

from ..clusters.reader import cluster_request
from ..core.errors import BCSError
from ..core.records import CredentialRecord
from ..outbound.causes import OutboundError
from ..outbound.transport import Transport
from .model import RBAC_API, Binding

MAX_ANSWER = 16 * 1024 * 1024


class KubeError(Exception):
    """A request the cluster answered with an error (``status``) or could not be made (``status`` 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _collection(kind: str, namespace: str | None) -> str:
    plural = "clusterrolebindings" if kind == "ClusterRoleBinding" else "rolebindings"
    if namespace:
        return f"/apis/{RBAC_API}/namespaces/{quote(namespace, safe='')}/{plural}"
    return f"/apis/{RBAC_API}/{plural}"


class BindingClient:
    """CRUD on ``(Cluster)RoleBindings`` of one cluster.

    :param credentials: what the cluster's kube-agent reported.
    :param transport: pooled, time-bounded HTTP transport.
    :param tls_server_name: verify the apiserver certificate for this name.
    :param verify: ``False`` only when an operator turned checking off.
    """

    def __init__(self, credentials: CredentialRecord, transport: Transport, *,
                 tls_server_name: str | None = None, verify: bool = True) -> None:
        self.cluster_id = credentials.cluster_id
        self._credentials = credentials
        self._transport = transport
        self._server_name = tls_server_name
        self._verify = verify

    def _call(self, method: str, path: str, query: dict[str, str] | None = None,
              body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            status, reason, document = cluster_request(
                self._transport, self._credentials, method, path, query=urlencode(query or {}), body=body,
                tls_server_name=self._server_name, verify=self._verify, max_bytes=MAX_ANSWER,
            )
        except (OutboundError, BCSError) as exc:  # a cause, or the size bound: messages name hosts only
            raise KubeError(exc.message) from None
        except OSError:
            raise KubeError(f"{method} {path}: read failed") from None
        if status >= 400:
            message = document.get("message") if isinstance(document, dict) else None
            raise KubeError(f"{method} {path}: HTTP {status}: {message or reason}", status)
        if document is None:
            return {}
        if not isinstance(document, dict):
            raise KubeError(f"{method} {path}: answer is not a JSON object")
        return document

    def list_owned(self, kind: str, selector: str) -> list[dict[str, Any]]:
        """Every binding of ``kind`` (all namespaces) matching the label ``selector``."""
        items = self._call("GET", _collection(kind, None), {"labelSelector": selector}).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def get(self, binding: Binding) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"{_collection(binding.kind, binding.namespace)}/{quote(binding.name, safe=':@')}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, binding: Binding) -> None:
        self._call("POST", _collection(binding.kind, binding.namespace), body=binding.body)

    def replace(self, binding: Binding, resource_version: str) -> None:
        body = json.loads(json.dumps(binding.body))
        body["metadata"]["resourceVersion"] = resource_version
        self._call("PUT", f"{_collection(binding.kind, binding.namespace)}/{quote(binding.name, safe=':@')}",
                   body=body)

    def delete(self, kind: str, namespace: str | None, name: str, uid: str | None = None) -> None:
        # The uid precondition keeps us from deleting a same-named object created
        # by someone else between our list and our delete.
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}  # type: ignore[assignment]
        try:
            self._call("DELETE", f"{_collection(kind, namespace)}/{quote(name, safe=':@')}", body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise
