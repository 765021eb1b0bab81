"""Reading objects from a cluster with its reported credentials (admission's ``ClusterReader``).

The Kubernetes admission protocol needs the old object of an UPDATE, the current
object behind a PATCH, and a namespace's labels. They are read as the cluster's
own service account (what the kube-apiserver itself would see), through the same
pooled transport the tunnel uses, with a bounded body and the transport's timeouts.
"""

from __future__ import annotations

import json
from typing import Any

from .. import environ as env
from ..errors import BadGateway, BCSError, ServiceUnavailable
from ..middleware.routing import CachedDirectory
from .transport import Transport

MAX_OBJECT = 3 * 1024 * 1024


class TunnelClusterReader:
    """:param directory: clusters and credentials (the routing layer's cache).
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
        upstream = env.Upstream(
            base_urls=creds.server_addresses, path=api_path, ca_pem=creds.cacert_pem,
            server_name=self.tls_server_name, verify=self.verify, bearer_token=creds.user_token,
            name=f"cluster:{cluster_id}",
        )
        # The transport frames requests; credentials are the caller's to set (the proxy does
        # the same for tunnel traffic).
        headers = [("Accept", "application/json"), ("Authorization", f"Bearer {creds.user_token}")]
        response = self.transport.send(upstream, "GET", headers, None, None)
        try:
            chunks: list[bytes] = []
            size = 0
            while piece := response.read1(65536):
                size += len(piece)
                if size > MAX_OBJECT:
                    raise BadGateway(f"{api_path} on cluster {cluster_id!r} is larger than {MAX_OBJECT} bytes")
                chunks.append(piece)
        except BCSError:
            response.close()
            raise
        else:
            response.release_conn()
        if response.status == 404:
            return None
        if response.status != 200:
            raise BadGateway(f"reading {api_path} from cluster {cluster_id!r} failed with HTTP {response.status}")
        try:
            document = json.loads(b"".join(chunks))
        except ValueError:
            raise BadGateway(f"cluster {cluster_id!r} answered {api_path} with invalid JSON") from None
        if not isinstance(document, dict):
            raise BadGateway(f"cluster {cluster_id!r} answered {api_path} with a non-object")
        return document

    def get_object(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        return self._get(cluster_id, api_path)

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        document = self._get(cluster_id, f"/api/v1/namespaces/{namespace}")
        if document is None:
            return {}
        labels = (document.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}
