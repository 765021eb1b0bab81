"""Kubernetes audit events (``audit.k8s.io/v1`` ``Event``, JSON lines) for every tunnel request.

Tools that read a kube-apiserver's audit log (Falco's k8saudit plugin, Elastic's
Kubernetes audit integration, Loki/Promtail pipelines) read these too: one JSON
object per line, ``"kind": "Event"``, ``"apiVersion": "audit.k8s.io/v1"``.

Per request, as the apiserver does: ``RequestReceived`` (stamped with the time it
arrived, written once the user is known: when the response starts — or, when an exporter is
in ``blocking-strict`` mode, right before the request is forwarded, and a failure to deliver
it refuses the request with a ``500`` and nothing sent upstream, as kube-apiserver's
``endpoints/filters/audit.go`` does),
``ResponseStarted`` when a long-running answer starts (watch, ``logs -f``, exec,
attach, port-forward, proxy), ``ResponseComplete`` when it has been sent, ``Panic``
when the gateway failed unexpectedly; each stage can be omitted by the policy
(:mod:`.policy`). An exec/attach/port-forward session's ``ResponseStarted`` is its
start, its ``ResponseComplete`` its end, with the session's duration and bytes in
``annotations``.

An exec/attach session's ``ResponseComplete`` is the session's one record: besides the
event's ``user`` and ``objectRef`` it carries in ``annotations`` the container, command, tty,
start and end, bytes each way, the exit code the apiserver reported and the recording's id
and outcome (:func:`~bcs_middleware.audit.events.session_annotations`) — the recorder's
(``bcs.session``, :mod:`bcs_middleware.layers.session_recording`) when the session was
recorded, else worked out from the request's facts.

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

The events themselves are built by :mod:`bcs_middleware.audit.events` (pure) and written
by :class:`~bcs_middleware.audit.sink.AuditSink`; this module is the WSGI layer between.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..audit.events import (
    ANNOTATION_PREFIX,
    MAX_CAPTURED,
    AuditEvent,
    build_event,
    carries_credentials,
    request_uri,
    session_annotations,
)
from ..audit.export.exporter import AuditExportUnavailable, Exporter
from ..audit.export.settings import OPTIONS as EXPORT_OPTIONS
from ..audit.export.settings import AuditExportSettings
from ..audit.export.settings import settings_from_options as export_settings
from ..audit.policy import DEFAULT_POLICY, Attributes, Level, Policy, load_policy
from ..audit.sink import AuditSink
from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.errors import BCSError, ConfigError
from ..core.requestinfo import RequestInfo
from ..core.worker_start import at_worker_start
from ..recording.catalog import SessionInfo
from .session_recording import session_of

__all__ = ["MAX_CAPTURED", "AuditEvent", "AuditMiddleware", "AuditSink", "classified", "filter_factory"]


def classified(environ: dict[str, Any]) -> tuple[RequestInfo, str]:
    """The request's classification and its ``requestURI`` (the path as forwarded).

    Both come from the request's facts (:func:`bcs_middleware.core.facts.of`): a path
    routing refuses (400) is named there percent-encoded, as a non-resource request;
    nothing a client sent reaches an event raw.
    """
    facts = request_facts.of(environ)
    return facts.info, request_uri(facts.api_path, str(environ.get("QUERY_STRING", "")))


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
    stamped with the time the request arrived — except when an exporter is in
    ``blocking-strict`` mode: then it is delivered right before the proxy forwards the
    request (``bcs.before_forward``), and a failure answers ``500`` with nothing sent. A
    request without a valid token is audited as ``system:anonymous``; the token itself is
    never part of an event.

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
        if self._may_capture and method in ("POST", "PUT", "PATCH", "DELETE") and not carries_credentials(info):
            tee = _TeeInput(environ["wsgi.input"], MAX_CAPTURED)
            environ["wsgi.input"] = tee
        audit = _RequestAudit(self, environ, start_response, info, uri, received, tee)
        if self.sink.strict:
            # blocking-strict: the proxy delivers RequestReceived before it sends anything.
            environ[env.BEFORE_FORWARD] = audit.before_forward
        try:
            body = self.app(environ, audit.start_response)
        except BCSError as exc:
            audit.decide()
            audit.event("ResponseComplete", code=exc.status, request_body=audit.request_body())
            raise  # rendered at the edge
        except Exception:
            audit.decide()
            audit.event("Panic", code=500, request_body=audit.request_body())
            raise
        # What RequestResponse needs is known only when the response starts: capture
        # whenever the policy could ask for it, and drop it unless it did.
        capture = self._may_capture and not info.long_running
        return _Audited(body, capture, audit.closed)


class _RequestAudit:
    """One request's audit: the level decided once, when the response starts (the user is
    known then, if there is one), and each stage's event as the request goes."""

    def __init__(self, layer: AuditMiddleware, environ: dict[str, Any], start_response: Any,
                 info: RequestInfo, uri: str, received: float, tee: _TeeInput | None) -> None:
        self._layer = layer
        self._clock = layer._clock
        self._environ = environ
        self._start_response = start_response
        self._info = info
        self._uri = uri
        self._received = received
        self._tee = tee
        self._decided = False
        self._level: Level = "None"
        self._omit: frozenset[str] = frozenset()
        self._audit_id = ""
        self._code = 0
        self._content_type = ""
        #: When a long-running answer (or a session) started: its ResponseStarted.
        self._started: float | None = None

    def request_body(self) -> bytes | None:
        """The request body the events carry (at ``Request`` level and above), as far as the
        layers below have read it (none once more than :data:`MAX_CAPTURED`)."""
        tee = self._tee
        if tee is not None and tee.copy and self._level in ("Request", "RequestResponse"):
            return bytes(tee.copy)
        return None

    def before_forward(self) -> None:
        """``blocking-strict``: the level decided and ``RequestReceived`` delivered now, before
        the proxy sends anything; :class:`AuditExportUnavailable` (500) refuses the request."""
        self.decide(strict=True)

    def decide(self, *, strict: bool = False) -> None:
        """The level, once, and the ``RequestReceived`` event. Only a request about to be
        forwarded (``strict``) fails for an undelivered event: one answered by the gateway
        itself (401, 403…) has nothing left to stop, and its events stay spooled."""
        if self._decided:
            return
        self._decided = True
        environ, info = self._environ, self._info
        # The request id (access log, X-Request-Id); a stack without RequestContextMiddleware gets one here.
        self._audit_id = environ.get(env.REQUEST_ID) or str(uuid.uuid4())
        attributes = Attributes(info, *env.kubernetes_identity(env.get_user(environ)))
        level, omit = self._layer.policy.decide(attributes)
        if level != "Metadata" and level != "None" and carries_credentials(info):
            level = "Metadata"  # whatever the policy says: never a secret's data or a token
        self._level, self._omit = level, omit
        try:
            self.event("RequestReceived", request_body=self.request_body(), at=self._received)
        except AuditExportUnavailable:
            if strict:
                raise

    def event(self, stage: str, **extra: Any) -> None:
        if self._level == "None" or stage in self._omit:
            return
        self._layer.sink.emit(self._event(stage, **extra))

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        self._code = int(status[:3])
        self._content_type = next((v for k, v in headers if k.lower() == "content-type"), "")
        self.decide()
        if self._info.long_running or self._code == 101:
            self._started = self._clock()
            self.event("ResponseStarted", request_body=self.request_body())
        start_response = self._start_response
        return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

    def closed(self, body: Any, captured: bytes | None, panicked: bool) -> None:
        """The response ended (``close()``): ``ResponseComplete``, or ``Panic`` if its body raised."""
        self.decide()
        annotations: dict[str, str] = {}
        result = getattr(body, "result", None)
        if self._started is not None and (self._code == 101 or result is not None):
            annotations[ANNOTATION_PREFIX + "session-seconds"] = f"{self._clock() - self._started:.3f}"
            if result is not None:
                annotations[ANNOTATION_PREFIX + "bytes-to-upstream"] = str(result.to_upstream)
                annotations[ANNOTATION_PREFIX + "bytes-to-client"] = str(result.to_client)
                annotations[ANNOTATION_PREFIX + "ended-by"] = str(result.ended_by)
        annotations.update(self._session(result))
        request_body = self.request_body()
        if panicked:
            self.event("Panic", extra_annotations=annotations, code=500, request_body=request_body)
            return
        response = captured if self._level == "RequestResponse" and "json" in self._content_type else None
        self.event("ResponseComplete", extra_annotations=annotations, response_body=response,
                   request_body=request_body)

    def _session(self, result: Any) -> dict[str, str]:
        """An exec/attach session's record: the recorder's (it saw the stream: exit code,
        recording id), else the request's facts and the splice's counts; ``{}``: not a session."""
        environ = self._environ
        session = environ.get(env.SESSION)
        if not isinstance(session, SessionInfo):
            if self._code != 101 or self._started is None:
                return {}
            session = session_of(environ, datetime.fromtimestamp(self._started, UTC))
            if session is None:
                return {}
            session = session.ended(ended_at=datetime.fromtimestamp(self._clock(), UTC))
            if result is not None:
                session = session.ended(bytes_to_upstream=result.to_upstream, bytes_to_client=result.to_client)
        return session_annotations(session)

    def _event(self, stage: str, *, request_body: bytes | None = None,
               extra_annotations: dict[str, str] | None = None, response_body: bytes | None = None,
               code: int | None = None, at: float | None = None) -> AuditEvent:
        environ = self._environ
        upstream = env.get_upstream(environ)
        cluster = env.get_cluster(environ)
        admission = environ.get(env.ADMISSION)
        annotations: dict[str, str] = {}
        if cluster is not None:
            annotations[ANNOTATION_PREFIX + "cluster"] = cluster.id
        if isinstance(admission, env.AdmissionResult):
            annotations.update(admission.audit_annotations)
        if extra_annotations:
            annotations.update(extra_annotations)
        status = code if code is not None else self._code
        return build_event(
            self._info, self._uri, level=self._level, stage=stage, audit_id=self._audit_id,
            user=env.get_user(environ), impersonate=upstream.impersonate if upstream is not None else None,
            source_ip=environ.get("REMOTE_ADDR", ""), user_agent=environ.get("HTTP_USER_AGENT"),
            received=self._received, at=at if at is not None else self._clock(), code=status,
            annotations=annotations, request_body=request_body, response_body=response_body,
        )


_OPTIONS: dict[str, conv.Converter] = {
    "log": conv.text,
    "policy_file": conv.text,
    "data_dir": conv.text,
    **EXPORT_OPTIONS,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#audit``: audit events for tunnel requests.

    ``log`` is a file path (appended, created 0600) or ``-`` for standard output;
    a relative path is in ``data_dir`` when one is given (the gateway's data
    directory), as the gateway's other files are. ``policy_file`` is an
    ``audit.k8s.io/v1`` Policy (default: every request at ``Metadata``). Put it in
    front of ``token_auth`` (or of the whole ``gateway`` app, see
    ``examples/audited_gateway.ini``) so that refused requests are audited too.

    The export keys are the gateway's (``serve --audit-webhook-*``, ``--audit-syslog-*``,
    ``--audit-spool-*``; :mod:`bcs_middleware.audit.export.settings`), with the same
    meaning: relative paths and the spools (``audit-spool``) are in ``data_dir``. Each
    worker starts its exporters when it is initialised under the gateway's gunicorn hooks
    (``examples/gunicorn.conf.py``), else with its first audited request; ``log`` may then
    be left out::

        [filter:audit]
        use = egg:bcs-middleware#audit
        get data_dir = data_dir
        log = /var/log/bcs/audit.jsonl
        policy_file = /etc/bcs/audit-policy.yaml
        audit_webhook_config_file = /etc/bcs/siem.kubeconfig
        audit_syslog_url = tls://siem.example.com:6514
        audit_spool_max_size = 1GiB

        [pipeline:main]
        pipeline = audit token_auth cluster_routing upstream
    """
    section = "filter:audit"
    opts = conv.convert_options(section, local_conf, _OPTIONS)
    data_dir = Path(opts["data_dir"]) if opts.get("data_dir") else None
    export = export_settings({k: v for k, v in opts.items() if k in EXPORT_OPTIONS}, section=section,
                             base=data_dir)
    if not opts.get("log") and not export.enabled:
        raise ConfigError(f"[{section}] needs log (a file path, or - for standard output) or an export "
                          "(audit_webhook_config_file, audit_syslog_url)")
    policy = load_policy(opts["policy_file"]) if opts.get("policy_file") else DEFAULT_POLICY
    log_path = opts.get("log")
    if log_path and log_path not in ("-", "stdout") and data_dir is not None:
        log_path = str(data_dir / log_path)  # an absolute log stays as it is
    sink = AuditSink.open(log_path or None, exporters=_exporters(export, data_dir, section))
    if sink.exporters:
        # Spools left by an earlier worker are sent from the start, not from the first request.
        at_worker_start(sink.start)

    def make(app: Any) -> AuditMiddleware:
        return AuditMiddleware(app, sink=sink, policy=policy)

    return make


def _exporters(export: AuditExportSettings, data_dir: Path | None, section: str) -> list[Exporter]:
    """The export backends, calling out through a transport of their own (the gateway's
    outbound defaults: timeouts, TLS verified; the webhook's kubeconfig says what to trust)."""
    if not export.enabled:
        return []
    from ..audit.export.assemble import build_exporters
    from ..outbound.addresses import AddressPolicy
    from ..outbound.transport import PooledTransport

    if data_dir is None and export.spool_dir is None:
        raise ConfigError(f"[{section}] audit export needs data_dir (or audit_spool_dir) for its spool")
    policy = AddressPolicy()
    return build_exporters(export, data_dir=data_dir, transport=PooledTransport(address_policy=policy),
                           address_policy=policy)
