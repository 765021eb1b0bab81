"""The outermost layer: request id, error style, metrics and the JSON access log.

:class:`RequestContextMiddleware` gives every request an id (a client's
``X-Request-Id`` is kept when it is short and printable, else one is generated)
and returns it in the response; classifies the request once
(:func:`bcs_middleware.core.facts.classify`, kept as ``bcs.facts`` for every layer
inside); marks Kubernetes-route paths so errors render as Kubernetes ``Status`` and
Mesos paths (``/bcsapi/``, ``/mesosdriver/``) so they render as the bcs envelope; counts
requests and latency per route kind (:attr:`bcs_middleware.core.routes.Route.label`); and writes one
JSON line per request to the ``bcs_middleware.access`` logger when the response
is finished (closed)::

    {"time": "...", "request_id": "...", "user": "alice", "cluster": "BCS-K8S-001",
     "method": "GET", "path": "/tunnels/clusters/BCS-K8S-001/api/v1/pods", "status": 200,
     "bytes": 5120, "duration_ms": 12.3, "kind": "tunnel", "webhooks": ["sidecar.example.com"]}

It never logs a query string, a header or a body, so no token or credential can
reach the log through it; what it logs of the request (path, user, cluster) is JSON
with every control character escaped, so no client forges a line or a terminal escape.

It is also the gateway's edge for errors nobody meant: an exception that escapes every
layer before the answer began is logged (with its traceback, for the operator) and
answered ``500`` in the route's error style — a Kubernetes ``Status`` on tunnel paths,
the bcs envelope on Mesos paths, ``{"code_name", "message"}`` elsewhere — never the
server's HTML page, which kubectl and bcs clients cannot read.

Reads ``bcs.user``, ``bcs.cluster``, ``bcs.admission`` (set by the layers inside,
read when the response is closed); sets ``bcs.request_id``, ``bcs.facts`` and ``bcs.error_style``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from time import monotonic
from typing import Any, NamedTuple

from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.errors import answer_unexpected
from ..core.printable import json_line
from ..telemetry.logsetup import LineWriterHandler
from ..telemetry.metrics import BATCH

access_log = logging.getLogger("bcs_middleware.access")


class AccessLine(NamedTuple):
    """An access-log message that becomes its JSON text only when ``str()`` is taken.

    The request thread captures what it has — the ``bcs.*`` objects themselves,
    monotonic seconds; turning them into names, milliseconds and JSON happens on the
    log writer thread of ``bcs-middleware serve``, off the request's path. Any other
    handler gets the same text from ``record.getMessage()``.
    """

    when: float  # time.time()
    request_id: str
    remote_addr: str
    user: Any  # the bcs.* values, or None
    agent: Any
    cluster: Any
    admission: Any
    method: str
    path: str
    status: int
    sent: int
    seconds: float
    kind: str

    def __str__(self) -> str:
        if isinstance(self.user, env.User):
            user_name: str | None = self.user.name
        elif isinstance(self.agent, env.ClusterAgent):
            user_name = f"cluster-agent:{self.agent.cluster_id}"
        else:
            user_name = None
        admission = self.admission
        # JSON escapes every control character a client put in a path or a name (DEL too).
        return json_line({
            "time": _timestamp(self.when), "request_id": self.request_id,
            "remote_addr": self.remote_addr, "user": user_name,
            "cluster": self.cluster.id if isinstance(self.cluster, env.Cluster) else None,
            "method": self.method, "path": self.path, "status": self.status, "bytes": self.sent,
            "duration_ms": round(self.seconds * 1000, 3), "kind": self.kind,
            "webhooks": list(admission.webhooks) if isinstance(admission, env.AdmissionResult) else [],
        })


def _new_request_id() -> str:
    """32 hex digits of ``os.urandom``: unguessable, so no client can predict another's id."""
    return os.urandom(16).hex()


def _timestamp(now: float) -> str:
    """UTC ``now`` as ``2024-01-02T03:04:05.678Z`` (milliseconds truncated, as isoformat does)."""
    sec = int(now)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(sec))}.{int((now - sec) * 1000):03d}Z"


class _Finished:
    """Wraps the response body: counts bytes, and logs once when the server closes it."""

    __slots__ = ("_done", "_iterable", "_on_close", "sent")

    def __init__(self, iterable: Iterable[bytes], on_close: Callable[[int], None]) -> None:
        self._iterable = iterable
        self._on_close = on_close
        self._done = False
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._iterable:
            self.sent += len(piece)
            yield piece

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            close = getattr(self._iterable, "close", None)
            if close is not None:
                close()
        finally:
            self._on_close(self.sent)


class _FinishedList(list[bytes]):
    """A list body (the proxy's small answers, every error), logged once when closed.

    Its size is known up front, so the server iterates the list itself rather than
    a generator counting each piece; it counts as sent whole, as the generator
    counts each piece when it hands it over.
    """

    __slots__ = ("_on_close",)

    def __init__(self, body: list[bytes], on_close: Callable[[int], None]) -> None:
        super().__init__(body)
        self._on_close: Callable[[int], None] | None = on_close

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(sum(map(len, self)))


class RequestContextMiddleware:
    """Request id, error style, request metrics and the access log.

    :param app: the WSGI application.
    :param access_log: write the JSON access-log line (``bcs_middleware.access``).
    """

    def __init__(self, app: Any, *, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        incoming = environ.get("HTTP_X_REQUEST_ID")
        request_id = (incoming if incoming and len(incoming) <= 128 and incoming.isprintable()
                      else _new_request_id())
        environ[env.REQUEST_ID] = request_id
        # Classified once, before anything is looked up; every layer inside reads these facts.
        facts = environ[env.FACTS] = request_facts.classify(environ)
        style = _ERROR_STYLES.get(facts.label)
        if style is not None:
            environ[env.ERROR_STYLE] = style
        exchange = _Exchange(environ, request_id, facts.label, start_response)
        try:
            body = self.app(environ, exchange.start_response)
        except OSError:
            raise  # the client's connection (or a handed-over socket): the server closes it
        except Exception:
            if exchange.status_code:
                raise  # the answer has begun: only the server can end it (it closes the connection)
            body = answer_unexpected(environ, exchange.start_response)
        if not self.access_log:
            return body
        if type(body) is list:
            return _FinishedList(body, exchange.log)
        return _Finished(body, exchange.log)


#: The error style of a route kind whose clients parse their own envelope (else the default).
_ERROR_STYLES = {
    "tunnel": "kubernetes",
    "mesos": "bcs",  # bcs clients parse the envelope, even of a 401
}


class _Exchange:
    """One request as this layer sees it: the answer's status once it begins (counted in the
    request metrics, the request id added) and, at the end, its access-log line."""

    __slots__ = ("_start_response", "environ", "kind", "method", "path", "request_id", "started", "status_code")

    def __init__(self, environ: dict[str, Any], request_id: str, kind: str, start_response: Any) -> None:
        self.environ = environ
        self.request_id = request_id
        self.kind = kind
        self.method = environ.get("REQUEST_METHOD", "GET")
        self.path = environ.get("PATH_INFO", "")
        self.started = monotonic()
        self.status_code = 0
        self._start_response = start_response

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        headers.append(("X-Request-Id", self.request_id))
        code = status[:3]
        self.status_code = int(code)
        cluster = self.environ.get(env.CLUSTER)
        BATCH.request(self.kind, cluster.id if type(cluster) is env.Cluster else "", self.method, code,
                      monotonic() - self.started)
        if exc_info:
            return self._start_response(status, headers, exc_info)
        return self._start_response(status, headers)

    def log(self, sent: int) -> None:
        """Write the access line (``sent``: the body's bytes), when the access log is on."""
        if not access_log.isEnabledFor(logging.INFO):
            return
        environ = self.environ
        line = AccessLine(
            when=time.time(), request_id=self.request_id, remote_addr=environ.get("REMOTE_ADDR", ""),
            user=environ.get(env.USER), agent=environ.get(env.AGENT),
            cluster=environ.get(env.CLUSTER), admission=environ.get(env.ADMISSION),
            method=self.method, path=self.path, status=self.status_code, sent=sent,
            seconds=monotonic() - self.started, kind=self.kind,
        )
        writer = LineWriterHandler.sole_handler(access_log, logging.INFO)
        if writer is not None:
            writer.submit(line)
            return
        # Logger.info would walk the stack to find the caller (findCaller) for every line; the
        # record is built directly instead, then handled exactly as info() would (filters,
        # handlers, propagation).
        access_log.handle(access_log.makeRecord(access_log.name, logging.INFO, __file__, 0, line, (), None, "_log"))


_OPTIONS: dict[str, conv.Converter] = {"access_log": conv.asbool}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#request_context``: request id, metrics, access log.

    Outermost in a pipeline, so that every layer after it (and the audit events) share the
    request id::

        [filter:request_context]
        use = egg:bcs-middleware#request_context
        access_log = true

        [pipeline:main]
        pipeline = request_context audit token_auth myapp
    """
    opts = conv.convert_options("filter:request_context", local_conf, _OPTIONS)

    def make(app: Any) -> RequestContextMiddleware:
        return RequestContextMiddleware(app, access_log=opts.get("access_log", True))

    return make
