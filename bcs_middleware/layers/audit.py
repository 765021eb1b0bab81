"""Kubernetes audit events (``audit.k8s.io/v1`` ``Event``, JSON lines) for every tunnel request.

Tools that read a kube-apiserver's audit log (Falco's k8saudit plugin, Elastic's
Kubernetes audit integration, Loki/Promtail pipelines) read these too: one JSON
object per line, ``"kind": "Event"``, ``"apiVersion": "audit.k8s.io/v1"``.

Per request, as the apiserver does: ``RequestReceived`` (stamped with the time it
arrived, written once the user is known: when the response starts),
``ResponseStarted`` when a long-running answer starts (watch, ``logs -f``, exec,
attach, port-forward, proxy), ``ResponseComplete`` when it has been sent, ``Panic``
when the gateway failed unexpectedly; each stage can be omitted by the policy
(:mod:`.policy`). An exec/attach/port-forward session's ``ResponseStarted`` is its
start, its ``ResponseComplete`` its end, with the session's duration and bytes in
``annotations``.

Requests refused before the tunnel (401 for the token, 403, 404) are audited too,
as a kube-apiserver audits failed authentication: the layer sits in front of token
authentication, and an unauthenticated request's ``user`` is ``system:anonymous``.

``user`` is the gateway user; ``impersonatedUser`` the identity the cluster was
asked to act as (the upstream's :class:`~bcs_middleware.core.impersonation.Impersonation`),
when there is one. Never a token: the
client's ``Authorization`` is not part of an event and query parameters naming a
token are dropped from ``requestURI``. Bodies only at ``Request`` level
(``requestObject``) and ``RequestResponse`` (``responseObject``), JSON only, at
most :data:`MAX_CAPTURED` bytes each — and never for Secrets, service-account
TokenRequests, TokenReviews and CSRs, which stay at ``Metadata`` whatever the policy.

Events are formatted and written off the request thread
(:class:`~bcs_middleware.telemetry.logsetup.LineWriterHandler`), like the access log.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, quote, urlencode

from ..admission.review import user_info
from ..audit.policy import DEFAULT_POLICY, Attributes, Level, Policy, load_policy
from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.bodies import parse_json
from ..core.errors import BCSError, ConfigError
from ..core.printable import json_line
from ..core.requestinfo import RequestInfo
from ..telemetry.logsetup import LineWriterHandler

log = logging.getLogger(__name__)
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


def _carries_credentials(info: RequestInfo) -> bool:
    return (info.api_group, info.resource, info.subresource) in _CREDENTIAL_BODIES


def classified(environ: dict[str, Any]) -> tuple[RequestInfo, str]:
    """The request's classification and its ``requestURI`` (the path as forwarded).

    Both come from the request's facts (:func:`bcs_middleware.core.facts.of`): a path
    routing refuses (400) is named there percent-encoded, as a non-resource request;
    nothing a client sent reaches an event raw.
    """
    facts = request_facts.of(environ)
    safe_query = quote(_safe_query(str(environ.get("QUERY_STRING", ""))).encode("latin-1", "replace"),
                       safe=_QUERY_SAFE)
    return facts.info, facts.api_path + (f"?{safe_query}" if safe_query else "")


def _safe_query(query: str) -> str:
    """The query without parameters that could carry a credential."""
    if "token" not in query.lower():
        return query
    return urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if "token" not in k.lower()])


def _timestamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


class AuditSink:
    """Where events go: a file (appended, 0600) or a stream, written by a background thread."""

    def __init__(self, stream: TextIO) -> None:
        self._writer = LineWriterHandler(stream)

    @classmethod
    def open(cls, target: str) -> AuditSink:
        """``-`` or ``stdout``: standard output; otherwise a file path.

        A missing folder is created 0700 (as kube-apiserver's ``--audit-log-path`` does);
        one that cannot be is a :class:`ConfigError` naming the path.
        """
        if target in ("-", "stdout"):
            return cls(sys.stdout)
        path = Path(target)
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(mode=0o700, parents=True)
                log.info("created the audit log's folder %s (mode 0700)", path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"audit log {target}: {exc.strerror or exc}") from None
        return cls(io.TextIOWrapper(io.FileIO(fd, "a", closefd=True), encoding="utf-8", line_buffering=False))

    def emit(self, event: AuditEvent) -> None:
        self._writer.submit(event)

    def drain(self) -> None:
        self._writer.drain()

    def close(self) -> None:
        """Write what is queued and close the file (standard output stays open)."""
        self._writer.drain()
        if self._writer.stream is not sys.stdout:
            self._writer.stream.close()


class _Audited:
    """The response body: captures what RequestResponse needs, writes the last stage on close."""

    def __init__(self, body: Iterable[bytes], capture: bool,
                 on_close: Callable[[Any, bytes | None, bool], None]) -> None:
        self._body = body
        self._capture: bytearray | None = bytearray() if capture else None
        self._on_close = on_close
        self._done = False
        self._panicked = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            for piece in self._body:
                if self._capture is not None:
                    if len(self._capture) + len(piece) > MAX_CAPTURED:
                        self._capture = None
                    else:
                        self._capture += piece
                yield piece
        except OSError:
            raise  # a finished splice hands the connection over, or the client went away
        except Exception:
            self._panicked = True
            raise

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            captured = bytes(self._capture) if self._capture else None
            self._on_close(self._body, captured, self._panicked)


class _TeeInput:
    """The request body as the layers below read it, copied (bounded) for ``requestObject``."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self.copy: bytearray | None = bytearray()

    def _keep(self, data: bytes) -> bytes:
        if self.copy is not None:
            if len(self.copy) + len(data) > self._limit:
                self.copy = None  # too large to write: the event goes without it
            else:
                self.copy += data
        return data

    def read(self, *args: Any) -> bytes:
        return self._keep(self._stream.read(*args))

    def readline(self, *args: Any) -> bytes:
        return self._keep(self._stream.readline(*args))

    def __iter__(self) -> Iterator[bytes]:
        for line in self._stream:
            yield self._keep(line)


class AuditMiddleware:
    """Write an ``audit.k8s.io/v1`` Event per stage of every tunnel request.

    It sits *outside* token authentication, so that a request refused before the
    tunnel (401 for a missing or bad token, 403, 404 for a cluster the user may not
    see) is audited too, as a kube-apiserver audits failed authentication. The user
    is known only once the layers below have run, and the policy may decide by user:
    the ``RequestReceived`` event is therefore written when the response starts,
    stamped with the time the request arrived. A request without a valid token is
    audited as ``system:anonymous``; the token itself is never part of an event.

    Reads ``bcs.request_id`` (:class:`RequestContextMiddleware`, outside it), and
    when the response starts ``bcs.user``, ``bcs.cluster``, ``bcs.upstream`` and
    ``bcs.admission`` as the layers below set them; sets nothing. When the policy
    can ask for ``Request`` bodies it wraps ``wsgi.input`` to copy (at most
    :data:`MAX_CAPTURED` bytes of) what the layers below read — it never reads a
    body itself, so an unauthenticated request's body stays unread.

    :param app: token authentication and the tunnel behind it (cluster routing,
        admission, proxy): the layers that set what the events report.
    :param sink: where events go.
    :param policy: which requests, at which level, which stages.

    Example (PasteDeploy: :func:`filter_factory`)::

        AuditMiddleware(TokenAuthMiddleware(tunnel, ...), sink=AuditSink.open("audit.jsonl"))
    """

    def __init__(self, app: Any, *, sink: AuditSink, policy: Policy = DEFAULT_POLICY,
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.sink = sink
        self.policy = policy
        self._clock = clock
        self._may_capture = any(rule.level in ("Request", "RequestResponse") for rule in policy.rules)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if not request_facts.of(environ).kubernetes:
            return self.app(environ, start_response)
        received = self._clock()
        method = environ.get("REQUEST_METHOD", "GET")
        # Classified now, as the cluster will see the path (the tunnel prefix off): the
        # layers below rewrite PATH_INFO, and read the same classification.
        info, uri = classified(environ)
        tee: _TeeInput | None = None
        if self._may_capture and method in ("POST", "PUT", "PATCH", "DELETE") and not _carries_credentials(info):
            tee = _TeeInput(environ["wsgi.input"], MAX_CAPTURED)
            environ["wsgi.input"] = tee
        long_running = info.long_running
        # Decided once, when the response starts (the user is known then, if there is one).
        state: dict[str, Any] = {"code": 0, "started": None, "decided": False, "level": "None",
                                 "omit": frozenset()}

        def decide() -> None:
            if state["decided"]:
                return
            state["decided"] = True
            # The request id (access log, X-Request-Id); a stack without RequestContextMiddleware gets one here.
            state["audit_id"] = environ.get(env.REQUEST_ID) or str(uuid.uuid4())
            user = env.get_user(environ)
            attributes = Attributes(info, user.name, ("system:authenticated", *user.groups)) if user is not None \
                else Attributes(info, "system:anonymous", ("system:unauthenticated",))
            level, omit = self.policy.decide(attributes)
            if level != "Metadata" and level != "None" and _carries_credentials(info):
                level = "Metadata"  # whatever the policy says: never a secret's data or a token
            state.update(level=level, omit=omit)
            body = None
            if tee is not None and tee.copy and level in ("Request", "RequestResponse"):
                body = bytes(tee.copy)
            event("RequestReceived", request_body=body, at=received)
            state["request_body"] = body

        def event(stage: str, **extra: Any) -> None:
            if state["level"] == "None" or stage in state["omit"]:
                return
            self.sink.emit(self._event(environ, info, uri, state["level"], stage, received, state, **extra))

        def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            state["code"] = int(status[:3])
            state["content_type"] = next((v for k, v in headers if k.lower() == "content-type"), "")
            decide()
            if long_running or state["code"] == 101:
                state["started"] = self._clock()
                event("ResponseStarted", request_body=state["request_body"])
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        def _closed(body: Any, captured: bytes | None, panicked: bool) -> None:
            decide()
            annotations: dict[str, str] = {}
            result = getattr(body, "result", None)
            if state["started"] is not None and (state["code"] == 101 or result is not None):
                annotations[ANNOTATION_PREFIX + "session-seconds"] = f"{self._clock() - state['started']:.3f}"
                if result is not None:
                    annotations[ANNOTATION_PREFIX + "bytes-to-upstream"] = str(result.to_upstream)
                    annotations[ANNOTATION_PREFIX + "bytes-to-client"] = str(result.to_client)
                    annotations[ANNOTATION_PREFIX + "ended-by"] = str(result.ended_by)
            request_body = state["request_body"]
            if panicked:
                event("Panic", extra_annotations=annotations, code=500, request_body=request_body)
                return
            level = state["level"]
            response = captured if level == "RequestResponse" and "json" in state.get("content_type", "") else None
            event("ResponseComplete", extra_annotations=annotations, response_body=response,
                  request_body=request_body)

        try:
            body = self.app(environ, _start_response)
        except BCSError as exc:
            decide()
            event("ResponseComplete", code=exc.status, request_body=state["request_body"])
            raise  # rendered at the edge
        except Exception:
            decide()
            event("Panic", code=500, request_body=state["request_body"])
            raise
        # What RequestResponse needs is known only when the response starts: capture
        # whenever the policy could ask for it, and drop it unless it did.
        capture = self._may_capture and not long_running
        return _Audited(body, capture, _closed)

    def _event(self, environ: dict[str, Any], info: RequestInfo, uri: str, level: Level, stage: str,
               received: float, state: dict[str, Any], *, request_body: bytes | None = None,
               extra_annotations: dict[str, str] | None = None, response_body: bytes | None = None,
               code: int | None = None, at: float | None = None) -> AuditEvent:
        user = env.get_user(environ)
        upstream = env.get_upstream(environ)
        event: dict[str, Any] = {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": level,
            "auditID": state["audit_id"],
            "stage": stage,
            "requestURI": uri,
            "verb": info.verb,
            "user": user_info(user),
            "sourceIPs": [environ.get("REMOTE_ADDR", "")],
            "requestReceivedTimestamp": _timestamp(received),
            "stageTimestamp": _timestamp(at if at is not None else self._clock()),
        }
        if upstream is not None and upstream.impersonate is not None:
            event["impersonatedUser"] = {"username": upstream.impersonate.user,
                                         "groups": list(upstream.impersonate.groups)}
        agent = environ.get("HTTP_USER_AGENT")
        if agent:
            event["userAgent"] = agent
        if info.is_resource:
            ref = {"resource": info.resource, "namespace": info.namespace, "name": info.name,
                   "apiGroup": info.api_group, "apiVersion": info.api_version, "subresource": info.subresource}
            event["objectRef"] = {k: v for k, v in ref.items() if v}
        status = code if code is not None else state["code"]
        if stage != "RequestReceived" and status:
            event["responseStatus"] = {"metadata": {}, "code": status}
        annotations: dict[str, str] = {}
        cluster = env.get_cluster(environ)
        if cluster is not None:
            annotations[ANNOTATION_PREFIX + "cluster"] = cluster.id
        admission = environ.get(env.ADMISSION)
        if isinstance(admission, env.AdmissionResult):
            annotations.update(admission.audit_annotations)
        if extra_annotations:
            annotations.update(extra_annotations)
        if annotations:
            event["annotations"] = annotations
        return AuditEvent(event, request_body if level != "Metadata" else None, response_body)



_OPTIONS: dict[str, conv.Converter] = {
    "log": conv.text,
    "policy_file": conv.text,
    "data_dir": conv.text,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#audit``: audit events for tunnel requests.

    ``log`` is a file path (appended, created 0600) or ``-`` for standard output;
    a relative path is in ``data_dir`` when one is given (the gateway's data
    directory), as the gateway's other files are. ``policy_file`` is an
    ``audit.k8s.io/v1`` Policy (default: every request at ``Metadata``). Put it in
    front of ``token_auth`` (or of the whole ``gateway`` app, see
    ``examples/audited_gateway.ini``) so that refused requests are audited too::

        [filter:audit]
        use = egg:bcs-middleware#audit
        log = /var/log/bcs/audit.jsonl
        policy_file = /etc/bcs/audit-policy.yaml

        [pipeline:main]
        pipeline = audit token_auth cluster_routing upstream
    """
    opts = conv.convert_options("filter:audit", local_conf, _OPTIONS)
    if not opts.get("log"):
        raise ConfigError("[filter:audit] needs log (a file path, or - for standard output)")
    policy = load_policy(opts["policy_file"]) if opts.get("policy_file") else DEFAULT_POLICY
    log_path = opts["log"]
    if log_path not in ("-", "stdout") and opts.get("data_dir"):
        log_path = str(Path(opts["data_dir"]) / log_path)  # an absolute log stays as it is
    sink = AuditSink.open(log_path)

    def make(app: Any) -> AuditMiddleware:
        return AuditMiddleware(app, sink=sink, policy=policy)

    return make
