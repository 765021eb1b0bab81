"""JSON calls to a cluster's apiserver with the credentials its kube-agent reported.

The gateway itself reads and writes a few objects in clusters: the admission
layer needs the old object of a PUT or PATCH and a namespace's labels
(:class:`TunnelClusterReader`, the admission ``ClusterReader``); the RBAC sync
manages role bindings. Namespace labels and role bindings go through
:func:`cluster_request`, as the cluster's own service account; the objects a
request's caller acts on are read with :func:`upstream_request` as that caller (the
tunnel request's own credential and impersonation), so admission never shows a
caller what their RBAC hides. Both verify TLS against the reported CA, over the
tunnel's pooled transport and its timeouts, with a bounded answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from ..core import environ as env
from ..core.bodies import parse_json
from ..core.errors import BadGateway, BadRequest, BCSError, ServiceUnavailable, UpstreamUnreachable
from ..core.impersonation import impersonation_headers
from ..core.paths import encode_path
from ..core.records import CredentialRecord
from ..outbound.causes import OutboundError, as_http_error
from ..outbound.transport import Transport
from .directory import CachedDirectory, upstream_for

log = logging.getLogger(__name__)

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

    :raises OutboundError: the transport's cause (connect, TLS, timeout, ...).
    :raises BadGateway: the answer exceeds ``max_bytes``.
    """
    upstream = upstream_for(credentials, path=path, query=query, server_name=tls_server_name, verify=verify)
    return upstream_request(transport, upstream, method, body=body, max_bytes=max_bytes)


def upstream_request(
    transport: Transport,
    upstream: env.Upstream,
    method: str,
    *,
    body: Any = None,
    max_bytes: int = MAX_OBJECT,
) -> tuple[int, str, Any]:
    """One JSON request to ``upstream`` as the tunnel would send it: its credential, the
    caller's impersonation and its ``set_headers``; returns ``(status, reason, document)``."""
    # The transport frames requests; credentials are the caller's to set (the proxy does the
    # same for tunnel traffic, through the same rendering of the impersonation).
    headers = [("Accept", "application/json")]
    if upstream.impersonate is not None:
        headers.extend(impersonation_headers(upstream.impersonate))
    headers.extend(upstream.set_headers)
    if upstream.bearer_token:
        headers.append(("Authorization", f"Bearer {upstream.bearer_token}"))
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
                raise BadGateway(f"{method} {upstream.path} on {upstream.name or 'the cluster'}: "
                                 f"answer larger than {max_bytes} bytes")
            chunks.append(piece)
    except (OutboundError, BCSError, OSError):
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
        try:
            status, _, document = cluster_request(self.transport, creds, "GET", api_path,
                                                  tls_server_name=self.tls_server_name, verify=self.verify)
        except OutboundError as cause:
            raise as_http_error(cause) from None
        if status == 404:
            return None
        if status != 200:
            raise BadGateway(f"reading {api_path} from cluster {cluster_id!r} failed with HTTP {status}")
        if not isinstance(document, dict):
            raise BadGateway(f"cluster {cluster_id!r} answered {api_path} with something not a JSON object")
        return document

    def get_object(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        return self._get(cluster_id, api_path)

    def get_object_as(self, upstream: env.Upstream, api_path: str) -> dict[str, Any] | None:
        """The object at ``api_path`` as the tunnel request's caller sees it (``None``: 404).

        Sent with ``upstream``'s credential and impersonation headers, exactly as the
        request itself will be: the caller's own RBAC decides what they may read, and an
        answer other than 200 or 404 (403 above all) is raised as the cluster gave it.
        """
        target = dataclasses.replace(upstream, path=api_path, query="")
        try:
            status, reason, document = upstream_request(self.transport, target, "GET")
        except (OutboundError, BCSError) as failed:
            exc = as_http_error(failed) if isinstance(failed, OutboundError) else failed
            if exc.status not in (502, 504):
                raise exc from None
            # The addresses are the cluster owner's: what failed is for superusers and the
            # log only, as for the tunnel itself (upstream.proxy).
            log.warning("admission: cannot read %s from %s: %s", api_path, upstream.name or "?", exc.message)
            raise UpstreamUnreachable(exc, "cannot reach the cluster's apiserver") from None
        if status == 404:
            return None
        if status == 200 and isinstance(document, dict):
            return document
        if status == 200:
            raise BadGateway(f"the cluster answered {api_path} with something not a JSON object")
        if status >= 500:
            raise BadGateway(f"reading {api_path} from the cluster failed with HTTP {status}")
        message = document.get("message") if isinstance(document, dict) else None
        raise BCSError(str(message or f"{reason or 'HTTP'} reading {api_path}"), status=status,
                       code_name="CLUSTER_REFUSED_READ")

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        # The name came from a request path, decoded: encoded again, so it is one path segment.
        document = self._get(cluster_id, f"/api/v1/namespaces/{encode_path(namespace)}")
        if document is None:
            return {}
        labels = (document.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}
