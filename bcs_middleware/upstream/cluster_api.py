"""JSON calls to a cluster's apiserver with the credentials its kube-agent reported.

The gateway itself reads and writes a few objects in clusters: the admission
layer needs the old object of an UPDATE, the current object behind a PATCH and a
namespace's labels (:class:`TunnelClusterReader`, the admission ``ClusterReader``);
the RBAC sync manages role bindings. All of it goes through :func:`cluster_request`:
as the cluster's own service account, TLS verified against the reported CA, over
the tunnel's pooled transport and its timeouts, with a bounded answer.
"""

from __future__ import annotations

import json
from typing import Any

from .. import environ as env
from ..bodies import parse_json
from ..errors import BadGateway, BadRequest, BCSError, ServiceUnavailable
from ..middleware.routing import CachedDirectory
from ..store import CredentialRecord
from .transport import Transport

MAX_OBJECT = 3 * 1024 * 1024


def cluster_request(
    transport: Transport,
    credentials: CredentialRecord,
    method: str,
    path: str,
    *,
    query: str = "",
    body: Any = None,
    tls_server_name: str | None = None,
    verify: bool = True,
    max_bytes: int = MAX_OBJECT,
) -> tuple[int, str, Any]:
    """One JSON request; returns ``(status, reason, document)`` (``None`` for an empty or non-JSON answer).

    :raises BCSError: the transport's connect/TLS/timeout errors, or
        :class:`BadGateway` when the answer exceeds ``max_bytes``.
    """
    upstream = env.Upstream(
        base_urls=credentials.server_addresses, path=path, query=query, ca_pem=credentials.cacert_pem,
        server_name=tls_server_name, verify=verify, bearer_token=credentials.user_token,
        name=f"cluster:{credentials.cluster_id}",
    )
    # The transport frames requests; credentials are the caller's to set (the proxy does the
    # same for tunnel traffic).
    headers = [("Accept", "application/json"), ("Authorization", f"Bearer {credentials.user_token}")]
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers.append(("Content-Type", "application/json"))
    response = transport.send(upstream, method, headers, [payload] if payload else None,
                              len(payload) if payload else None)
    chunks: list[bytes] = []
    size = 0
    try:
        while piece := response.read1(65536):
            size += len(piece)
            if size > max_bytes:
                raise BadGateway(f"{method} {path} on cluster {credentials.cluster_id!r}: "
                                 f"answer larger than {max_bytes} bytes")
            chunks.append(piece)
    except (BCSError, OSError):
        response.close()
        response.release_conn()
        raise
    response.release_conn()
    try:
        document = parse_json(b"".join(chunks), what="the apiserver's answer") if chunks else None
    except BadRequest:
        document = None
    return response.status, response.reason, document


class TunnelClusterReader:
    """The admission layer's ``ClusterReader`` over the tunnel's credentials.

    :param directory: clusters and credentials (the routing layer's cache).
    :param transport: the upstream transport (pools, TLS, timeouts).
    :param tls_server_name: as the routing layer's option of that name.
    """

    def __init__(self, directory: CachedDirectory, transport: Transport, *, tls_server_name: str | None = None,
                 verify: bool = True) -> None:
        self.directory = directory
        self.transport = transport
        self.tls_server_name = tls_server_name
        self.verify = verify

    def _get(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        _, creds = self.directory.lookup(cluster_id)
        if creds is None:
            raise ServiceUnavailable(f"cluster {cluster_id!r} has no credentials")
        status, _, document = cluster_request(self.transport, creds, "GET", api_path,
                                              tls_server_name=self.tls_server_name, verify=self.verify)
        if status == 404:
            return None
        if status != 200:
            raise BadGateway(f"reading {api_path} from cluster {cluster_id!r} failed with HTTP {status}")
        if not isinstance(document, dict):
            raise BadGateway(f"cluster {cluster_id!r} answered {api_path} with something not a JSON object")
        return document

    def get_object(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        return self._get(cluster_id, api_path)

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        document = self._get(cluster_id, f"/api/v1/namespaces/{namespace}")
        if document is None:
            return {}
        labels = (document.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}
