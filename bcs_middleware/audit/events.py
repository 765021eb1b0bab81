"""``audit.k8s.io/v1`` ``Event`` objects, built from what a request was (pure).

One JSON object per line, as a kube-apiserver writes its audit log
(``staging/src/k8s.io/apiserver/pkg/apis/audit/v1/types.go``): ``kind``, ``apiVersion``,
``level``, ``auditID``, ``stage``, ``requestURI``, ``verb``, ``user``,
``impersonatedUser``, ``sourceIPs``, ``userAgent``, ``objectRef``, ``responseStatus``,
``requestObject``/``responseObject`` (at ``Request``/``RequestResponse`` level),
``requestReceivedTimestamp``, ``stageTimestamp`` and ``annotations``.

Never a credential: query parameters naming a token are dropped from ``requestURI``;
Secrets, service-account TokenRequests, TokenReviews and CSRs stay at ``Metadata``
(:func:`carries_credentials`) whatever the policy says; and every byte a client chose is
percent-encoded in ``requestURI``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from ..admission.review import user_info
from ..core import environ as env
from ..core.bodies import parse_json
from ..core.impersonation import Impersonation
from ..core.printable import json_line
from ..core.requestinfo import RequestInfo
from ..recording.catalog import SessionInfo
from .policy import Level

__all__ = ["ANNOTATION_PREFIX", "MAX_CAPTURED", "AuditEvent", "build_event", "carries_credentials", "request_uri",
           "session_annotations"]

#: The most of a request or response body an event carries (bytes).
MAX_CAPTURED = 1024 * 1024
ANNOTATION_PREFIX = "bcs-middleware/"
# Characters a requestURI's query keeps as they are; anything else (controls, spaces,
# non-ASCII) is percent-encoded, as it is on the wire.
_QUERY_SAFE = "!$&'()*+,/:;=?@-._~%"

#: (group, resource, subresource) whose bodies hold credentials: audited at Metadata at most.
_CREDENTIAL_BODIES = {
    ("", "secrets", ""),
    ("", "serviceaccounts", "token"),
    ("authentication.k8s.io", "tokenreviews", ""),
    ("certificates.k8s.io", "certificatesigningrequests", ""),
}


def carries_credentials(info: RequestInfo) -> bool:
    """A request whose bodies may hold a credential (never captured)."""
    return (info.api_group, info.resource, info.subresource) in _CREDENTIAL_BODIES


def request_uri(api_path: str, query: str) -> str:
    """``requestURI``: the API path as forwarded (percent-encoded) and the query without
    parameters that could carry a credential, percent-encoded as on the wire. (WSGI strings
    carry the request's bytes as latin-1: they are encoded back to those bytes.)"""
    safe_query = quote(_safe_query(query).encode("latin-1", "replace"), safe=_QUERY_SAFE)
    return api_path + (f"?{safe_query}" if safe_query else "")


def _safe_query(query: str) -> str:
    """The query without parameters that could carry a credential."""
    if "token" not in query.lower():
        return query
    return urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if "token" not in k.lower()])


def _timestamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def session_annotations(session: SessionInfo) -> dict[str, str]:
    """An exec/attach session's record, as the annotations of its ``ResponseComplete`` event.

    User and groups are the event's ``user``, namespace and pod its ``objectRef``; the rest is
    here: container, command (a JSON array), tty, start and end, bytes each way, the exit code
    the apiserver reported (recorded sessions: it is read from the stream's error channel), the
    recording's id and what became of it.
    """
    p = ANNOTATION_PREFIX
    found = {
        p + "session-container": session.container,
        p + "session-command": json.dumps(list(session.command), ensure_ascii=False),
        p + "session-tty": "true" if session.tty else "false",
        p + "session-start": _timestamp(session.started_at.timestamp()),
        p + "bytes-to-upstream": str(session.bytes_to_upstream),
        p + "bytes-to-client": str(session.bytes_to_client),
    }
    if session.ended_at is not None:
        found[p + "session-end"] = _timestamp(session.ended_at.timestamp())
    if session.exit_code is not None:
        found[p + "session-exit-code"] = str(session.exit_code)
    if session.id:
        found[p + "recording-id"] = session.id
    found[p + "recording"] = session.status if session.id or session.status != "recording" else "off"
    if session.failure:
        found[p + "recording-failure"] = session.failure
    return found


class AuditEvent:
    """One event; turned into its JSON line on the writer thread (``str()``)."""

    __slots__ = ("event", "request_body", "response_body")

    def __init__(self, event: dict[str, Any], request_body: bytes | None = None,
                 response_body: bytes | None = None) -> None:
        self.event = event
        self.request_body = request_body
        self.response_body = response_body

    def as_dict(self) -> dict[str, Any]:
        event = dict(self.event)
        for key, raw in (("requestObject", self.request_body), ("responseObject", self.response_body)):
            if raw:
                try:
                    event[key] = parse_json(raw, what=key)
                except Exception:  # noqa: S110 -- not JSON (or too deep): the event goes without it
                    pass
        return event

    def __str__(self) -> str:
        return json_line(self.as_dict())


def build_event(
    info: RequestInfo,
    uri: str,
    *,
    level: Level,
    stage: str,
    audit_id: str,
    user: env.User | None,
    impersonate: Impersonation | None,
    source_ip: str,
    user_agent: str | None,
    received: float,
    at: float,
    code: int,
    annotations: Mapping[str, str],
    request_body: bytes | None = None,
    response_body: bytes | None = None,
) -> AuditEvent:
    """The event of one stage of a request.

    :param info: the request as kube-apiserver classifies it (``verb``, ``objectRef``).
    :param uri: its ``requestURI`` (:func:`request_uri`).
    :param user: the gateway user, ``None``: ``system:anonymous``.
    :param impersonate: the identity the cluster was asked to act as (``impersonatedUser``).
    :param received: when the request arrived; ``at``: when this stage happened (epoch seconds).
    :param code: the response status, ``0`` when none is known yet.
    """
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": level,
        "auditID": audit_id,
        "stage": stage,
        "requestURI": uri,
        "verb": info.verb,
        "user": user_info(user),
        "sourceIPs": [source_ip],
        "requestReceivedTimestamp": _timestamp(received),
        "stageTimestamp": _timestamp(at),
    }
    if impersonate is not None:
        event["impersonatedUser"] = {"username": impersonate.user, "groups": list(impersonate.groups)}
    if user_agent:
        event["userAgent"] = user_agent
    if info.is_resource:
        ref = {"resource": info.resource, "namespace": info.namespace, "name": info.name,
               "apiGroup": info.api_group, "apiVersion": info.api_version, "subresource": info.subresource}
        event["objectRef"] = {k: v for k, v in ref.items() if v}
    if stage != "RequestReceived" and code:
        event["responseStatus"] = {"metadata": {}, "code": code}
    if annotations:
        event["annotations"] = dict(annotations)
    return AuditEvent(event, request_body if level != "Metadata" else None, response_body)
