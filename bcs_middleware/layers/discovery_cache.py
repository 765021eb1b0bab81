"""Discovery and OpenAPI documents, cached per cluster and revalidated with the apiserver's ETag.

A kubectl with a cold cache (a CI job, a fresh container, every ``--kubeconfig`` in a new
home) asks for ``/api``, ``/apis`` (aggregated discovery, ``Accept: application/json;
g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList``), without aggregated discovery every
``/apis/{group}/{version}``, and for ``apply``/``explain`` ``/openapi/v2`` or ``/openapi/v3``
and its per-group documents; every run asks ``/version``. These answers are the same for
every user: kube-apiserver builds them from the APIs it serves, not from the caller
(``staging/src/k8s.io/apiserver/pkg/endpoints/discovery/aggregated/handler.go`` and
``etag.go``: one document and one ETag, ``Vary: Accept``; the OpenAPI handlers of
``k8s.io/kube-openapi`` likewise), and reading them is granted to every authenticated user by
the default ``system:discovery`` and ``system:public-info-viewer`` roles. So
:class:`DiscoveryCacheMiddleware` keeps them **per cluster** (never shared between clusters),
keyed by path, query, ``Accept`` and ``Accept-Encoding`` (the answer varies by them), and serves
them for ``ttl`` seconds without asking; then it asks again with ``If-None-Match`` and the
apiserver's ETag — a ``304`` renews the entry without a body. For a cluster reached through
its kube-agent's tunnel the entry is revalidated on every request (a ``304`` still saves the
body crossing the tunnel): a cached answer must not hide that the tunnel is gone.

It sits after cluster routing, so only a user allowed to use the cluster (``view``) reaches
it, and before admission and the proxy. An entry remembers the upstream it came from (the
addresses, CA, credential and tunnel the kube-agent reported): when the cluster's credentials
change, or its agent connection is replaced (:meth:`DiscoveryCacheMiddleware.forget_cluster`),
the cluster's entries are dropped. Only complete ``200`` answers up to ``max_entry_bytes`` are
kept, at most ``max_bytes`` per worker (least recently used first out). A client's own
``If-None-Match`` is answered from the entry (``304`` when it matches).

Reads ``bcs.facts``, ``bcs.cluster``, ``bcs.upstream``; sets nothing.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..limits.settings import DiscoveryCacheSettings
from ..telemetry.metrics import DISCOVERY_CACHE

#: The identity-independent documents: discovery (legacy and aggregated) and OpenAPI.
DOCUMENT_PATH = re.compile(r"/version|/api(/[^/]+)?|/apis(/[^/]+(/[^/]+)?)?|/openapi/v2|/openapi/v3(/[^?#]*)?")
#: Headers of the apiserver's answer that are kept and served with the document.
_KEPT = frozenset({"content-type", "content-encoding", "etag", "vary", "cache-control", "expires",
                   "last-modified"})
_MAX_KEY = 1024


@dataclass(frozen=True, slots=True)
class _Entry:
    source: str  # the upstream fingerprint it came from
    headers: tuple[tuple[str, str], ...]
    body: bytes
    etag: str | None
    checked: float  # when the apiserver last said it is current


def _fingerprint(upstream: env.Upstream) -> str:
    """What identifies where a cluster's documents came from (a digest: it covers the credential)."""
    parts = (repr(upstream.base_urls), upstream.ca_pem or "", upstream.bearer_token or "", upstream.tunnel or "",
             upstream.server_name or "", str(upstream.verify), repr(upstream.client_cert))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


class _Store:
    """Entries per (cluster, request), bounded in bytes, least recently used first out."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()

    def get(self, key: tuple[str, ...]) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: tuple[str, ...], entry: _Entry) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= len(old.body)
            self._entries[key] = entry
            self.size += len(entry.body)
            while self.size > self.max_bytes and self._entries:
                _key, dropped = self._entries.popitem(last=False)
                self.size -= len(dropped.body)

    def drop_cluster(self, cluster_id: str) -> int:
        with self._lock:
            keys = [key for key in self._entries if key[0] == cluster_id]
            for key in keys:
                self.size -= len(self._entries.pop(key).body)
            return len(keys)


class DiscoveryCacheMiddleware:
    """Serve discovery and OpenAPI documents from a per-cluster cache (see the module docs).

    :param app: the next layer (admission, then the proxy).
    :param settings: ``ttl``, ``max_entry_bytes``, ``max_bytes``.
    :param clock: monotonic seconds (tests).
    """

    def __init__(self, app: Any, *, settings: DiscoveryCacheSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.settings = settings
        self.clock = clock
        self.store = _Store(settings.max_bytes)

    def forget_cluster(self, cluster_id: str) -> None:
        """Drop ``cluster_id``'s documents (its agent connection was replaced)."""
        if self.store.drop_cluster(cluster_id):
            DISCOVERY_CACHE.labels("invalidated").inc()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        key = self._key(environ)
        upstream = env.get_upstream(environ)
        if key is None or upstream is None:
            return self.app(environ, start_response)
        source = _fingerprint(upstream)
        entry = self.store.get(key)
        if entry is not None and entry.source != source:
            self.forget_cluster(key[0])
            entry = None
        now = self.clock()
        # Behind a kube-agent tunnel every answer is revalidated: whether the tunnel is up is
        # known only to the worker (of whichever instance) holding the agent, and a cached answer
        # must not hide that the cluster cannot be reached (a rotated register token, an agent gone).
        if entry is not None and upstream.tunnel is None and now - entry.checked < self.settings.ttl:
            DISCOVERY_CACHE.labels("hit").inc()
            return self._serve(entry, environ, start_response)
        return self._fetch(key, source, entry, environ, start_response)

    def _key(self, environ: dict[str, Any]) -> tuple[str, ...] | None:
        if environ.get("REQUEST_METHOD") != "GET" or environ.get(env.UPGRADE):
            return None
        facts = request_facts.of(environ)
        cluster = env.get_cluster(environ)
        if cluster is None or facts.info.is_resource or not DOCUMENT_PATH.fullmatch(facts.api_path):
            return None
        key = (cluster.id, facts.api_path, _document_query(str(environ.get("QUERY_STRING", ""))),
               str(environ.get("HTTP_ACCEPT", "")), str(environ.get("HTTP_ACCEPT_ENCODING", "")))
        return key if sum(map(len, key)) <= _MAX_KEY else None

    def _serve(self, entry: _Entry, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if entry.etag is not None and environ.get("HTTP_IF_NONE_MATCH") == entry.etag:
            start_response("304 Not Modified", [(k, v) for k, v in entry.headers
                                                if k.lower() in ("etag", "vary", "cache-control")])
            return []
        start_response("200 OK", [*entry.headers, ("Content-Length", str(len(entry.body)))])
        return [entry.body]

    def _fetch(self, key: tuple[str, ...], source: str, entry: _Entry | None, environ: dict[str, Any],
               start_response: Any) -> Iterable[bytes]:
        asked = dict(environ)
        asked.pop("HTTP_IF_MODIFIED_SINCE", None)
        if entry is not None and entry.etag is not None:
            asked["HTTP_IF_NONE_MATCH"] = entry.etag
        else:
            asked.pop("HTTP_IF_NONE_MATCH", None)
        answer: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answer["status"], answer["headers"] = status, headers
            return lambda data: None  # the write() callable: the proxy streams by iteration

        checked = self.clock()
        body = self.app(asked, capture)
        status = answer.get("status", "")
        if status.startswith("304") and entry is not None:
            _close(body)
            renewed = _Entry(entry.source, entry.headers, entry.body, entry.etag, checked)
            self.store.put(key, renewed)
            DISCOVERY_CACHE.labels("revalidated").inc()
            return self._serve(renewed, environ, start_response)
        if not status.startswith("200"):
            DISCOVERY_CACHE.labels("uncacheable").inc()
            start_response(status, answer.get("headers", []))
            return body
        held, rest = _read_up_to(body, self.settings.max_entry_bytes)
        if rest is not None:
            DISCOVERY_CACHE.labels("uncacheable").inc()
            start_response(status, answer["headers"])
            return _Chained(held, rest, body)
        _close(body)
        data = b"".join(held)
        kept = tuple((name, value) for name, value in answer["headers"] if name.lower() in _KEPT)
        etag = next((value for name, value in kept if name.lower() == "etag"), None)
        fresh = _Entry(source, kept, data, etag, checked)
        self.store.put(key, fresh)
        DISCOVERY_CACHE.labels("miss" if entry is None else "refetched").inc()
        return self._serve(fresh, environ, start_response)


def _document_query(query: str) -> str:
    """The query as it selects a document: ``timeout`` (client-go's ``--request-timeout``) only
    bounds the call, so clients with different timeouts share the entry."""
    if "timeout=" not in query:
        return query
    return "&".join(part for part in query.split("&") if not part.startswith("timeout="))


def _read_up_to(body: Iterable[bytes], limit: int) -> tuple[list[bytes], Iterator[bytes] | None]:
    """The body's pieces while they fit in ``limit`` bytes; the iterator of the rest if they do not."""
    pieces: list[bytes] = []
    total = 0
    iterator = iter(body)
    for piece in iterator:
        pieces.append(piece)
        total += len(piece)
        if total > limit:
            return pieces, iterator
    return pieces, None


def _close(body: Iterable[bytes]) -> None:
    close = getattr(body, "close", None)
    if close is not None:
        close()


class _Chained:
    """A body too large to keep: what was read, then the rest, closed as the original."""

    def __init__(self, held: list[bytes], rest: Iterator[bytes], original: Iterable[bytes]) -> None:
        self._held, self._rest, self._original = held, rest, original

    def __iter__(self) -> Iterator[bytes]:
        yield from self._held
        self._held = []
        yield from self._rest

    def close(self) -> None:
        _close(self._original)


_OPTIONS: dict[str, conv.Converter] = {"ttl": conv.seconds, "max_entry_bytes": conv.size, "max_bytes": conv.size}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#discovery_cache``, right after cluster routing::

        [filter:discovery_cache]
        use = egg:bcs-middleware#discovery_cache
        ttl = 30s
        max_entry_bytes = 16MiB
        max_bytes = 128MiB

        [pipeline:main]
        pipeline = request_context token_auth cluster_routing discovery_cache upstream_proxy
    """
    opts = conv.convert_options("filter:discovery_cache", local_conf, _OPTIONS)
    settings = DiscoveryCacheSettings(**opts)

    def make(app: Any) -> DiscoveryCacheMiddleware:
        return DiscoveryCacheMiddleware(app, settings=settings)

    return make
