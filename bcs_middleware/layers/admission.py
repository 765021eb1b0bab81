"""Admission interception: writes, deletions and connections pass through webhook chains first.

:class:`AdmissionMiddleware` runs the webhooks a definition matches (mutating first,
validating after) and hands the downstream app what they admitted: the admitted body
of a create or update (a fresh ``wsgi.input`` with the right ``Content-Length``), the
admitted ``DeleteOptions`` of a DELETE, the path and query of the admitted options of
a CONNECT. Anything else — reads, requests no definition matches — passes through
untouched and unread.

A create or update body is buffered (bounded) only when a definition could match it,
decoded once as its receiver decodes it (:mod:`bcs_middleware.core.gojson`: duplicate keys
and out-of-range numbers refused; with ``canonical`` — the driver's bcs v4 field rules —
keys in the Go tags' spelling), and what goes on is **the re-encoding of the admitted
object** (:func:`~bcs_middleware.core.gojson.dumps`, compact) — never the client's bytes, so
what was judged is what the receiver reads. On the tunnel a body is read only when a
webhook configuration matches the request's resource and operation; a body no webhook
matches streams to the apiserver as sent (the apiserver decodes it, and nothing here
decided anything from it).

A bcs body (Create/Update definitions exist) must be JSON or YAML: another
non-empty body is a 415 naming a webhook it could have met (an application behind
the standalone filter may parse a form post anyway), an undecodable one a 400.
A JSON body that does not even mention a covered kind (``application``,
``deployment``; no ``\\u`` escape that could spell one) cannot match and streams
on unread.

Memory: a buffered body is held with its decoded object until its response ends,
so the layer reserves for it from a per-process budget (``buffer_memory``,
:class:`~bcs_middleware.core.bodies.BufferBudget`): before reading, what its declared
length could cost at worst; once its text is measured (length, number of values:
a Python object each), its estimate. One body may cost at most 12 times ``max_body``
(a body of more values is a 413 before anything is built); a request that finds
the budget full waits up to ``buffer_wait`` seconds, then gets a 429 with
``Retry-After`` (as kube-apiserver's in-flight limit answers). The object is
encoded once per version and that encoding is sent to each webhook (inside its
AdmissionReview, by reference) and upstream.

Which definitions apply:

* ``bcs.cluster`` of type ``k8s`` (or ``mode="kubernetes"``): the Kubernetes
  webhook configurations of that cluster, matched on the request as kube-apiserver
  classifies it (the request's facts, :func:`bcs_middleware.core.facts.of`: the
  tunnel path after ``/tunnels/clusters/{id}``, else ``PATH_INFO``);
* otherwise (Mesos, no cluster, ``mode="bcs"``): the bcs definitions, matched on
  POST = Create / PUT = Update and the body's ``kind``.

The operation is the one the apiserver admits (:mod:`bcs_middleware.core.requestinfo`;
resolved, with the objects admitted, by :mod:`bcs_middleware.admission.kubernetes`):
``POST`` is CREATE, a ``PUT`` is UPDATE when the object exists and CREATE when it does
not (asked of the cluster, as the caller), ``PATCH`` is UPDATE, ``DELETE`` is DELETE,
and **every method** on the ``exec``/``attach``/``portforward``/``proxy`` subresources
of pods (``proxy`` of nodes and services) is CONNECT — headers change none of this.

A CONNECT is admitted as ``ConnectResource`` admits it (:mod:`bcs_middleware.admission.options`):
the review's object is the connect options decoded from the query (and the proxied
path), and what goes on is the request rebuilt from the options the webhooks admitted —
never the client's own query. A DELETE of one object is reviewed with the object read
as the caller (``oldObject``) and its ``DeleteOptions`` (``options``), and goes on with
those options as its body, preconditioned on the ``uid`` and ``resourceVersion`` the
webhooks saw: an object swapped under its name meanwhile is not deleted (409). A
deletecollection, which the apiserver admits item by item, is refused (501, naming the
webhook) when a ``Fail`` webhook matches it, and passes with a ``Warning`` when only
``Ignore`` ones do.

A matched ``PATCH`` (JSON Patch or merge patch) is resolved against the current
object read **as the caller** (with ``bcs.upstream``'s credential and impersonation:
the caller's RBAC decides what they may see, and their 403/404 is the answer),
admitted as an UPDATE, and forwarded as a ``PATCH`` — a JSON Patch from the object
read to the admitted one, guarded by a ``test`` of its ``resourceVersion`` — so the
cluster's RBAC checks the ``patch`` verb the caller used. An UPDATE by ``PUT`` is
sent guarded by the ``resourceVersion`` read, so it cannot turn into an unadmitted
create. (The reverse cannot be guarded in a PUT: an object created by someone else
between the gateway's read and the write is updated by a body admitted as CREATE.)
Resolving a PUT, PATCH or DELETE needs the caller to be allowed to ``get`` the object.
Strategic-merge and apply patches cannot be resolved without the resource's schema
and are refused (415) rather than let through unadmitted.

Exempt are only the webhook-definition routes of the gateway and the mesos-driver
(whole paths, named in :mod:`bcs_middleware.core.routes`) and, on the tunnel, a
cluster's own webhook and admission-policy configurations
(``admissionregistration.k8s.io``, judged on the parsed API path), which the
kube-apiserver does not send to webhooks either.

Environ: reads ``bcs.cluster``, ``bcs.user``, ``bcs.upstream``, ``bcs.facts``
(classifying the request when no layer did); sets ``bcs.admission``
(:class:`~bcs_middleware.core.environ.AdmissionResult`); rewrites ``wsgi.input``,
``CONTENT_LENGTH`` (and, for a resolved PATCH or a DELETE, ``CONTENT_TYPE``), and for
an admitted CONNECT ``bcs.upstream``'s path and query (without routing in front:
``PATH_INFO`` and ``QUERY_STRING``) and ``bcs.facts``;
and for a bcs body it decoded sets ``bcs.document`` (the admitted object).
Webhook ``warnings`` become ``Warning: 299`` response headers.

Security: webhooks are only reached over HTTPS verified against their
``caBundle`` and service name; no credential of the request is sent to them
(the object and the user's name and groups only).

:param app: the WSGI app to protect.
:param store: the :class:`~bcs_middleware.admission.DefinitionStore`.
:param cluster_reader: reads namespace labels and current objects (Kubernetes).
:param mode: ``"auto"`` (by ``bcs.cluster``), ``"bcs"`` or ``"kubernetes"``.
:param max_body: largest body buffered; a larger matched request is a 413.
:param buffer_memory: bytes of estimated decoded bodies this process's layer holds at
    once (default 128 MiB, at least two bodies at their limit).
:param buffer_wait: seconds a request waits for room in the budget before its 429.
:param canonical: how the receiver reads a decoded bcs body:
    ``canonical(method, path, document)`` returns the document as the receiver
    decodes it (the driver passes its bcs v4 field rules,
    :func:`bcs_middleware.scheduler.routes.canonical`); by default the JSON as read.
    Webhook answers are read through it too.
:param total_budget: seconds all webhooks of one request may take together.
:param default_timeout: per-call timeout of bcs webhooks without ``timeoutSeconds``.
:param address_map: ``{"name.namespace": "host:port"}`` to connect elsewhere
    while verifying the service name.
:param breaker_threshold: consecutive failures that open a webhook's breaker.
:param breaker_cooldown: seconds an open breaker fails calls fast.
:param client: a ready :class:`~bcs_middleware.admission.WebhookClient` (the
    address map, breaker and transport options are then ignored).
:param transport: the outbound transport webhooks are called over (the gateway's one,
    shared with the proxy); default the process's
    :func:`~bcs_middleware.outbound.transport.default_transport`.

Example::

    app = AdmissionMiddleware(app, store=MemoryDefinitionStore(), total_budget=5)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from ..admission.client import CircuitBreaker, WebhookClient
from ..admission.engine import AdmissionEngine, Outcome, warning_headers
from ..admission.kubernetes import KubernetesAdmission
from ..admission.store import (
    ClusterReader,
    DefinitionStore,
    MemoryDefinitionStore,
    load_definitions_file,
)
from ..core import environ as env
from ..core import facts as request_facts
from ..core import gojson
from ..core.bodies import (
    BufferBudget,
    has_body,
    parse_json,
    parse_yaml,
    read_buffer,
    replace_body,
    yaml_node_limit,
)
from ..core.converters import Converter, asint, convert_options, mapping, seconds, size, text
from ..core.errors import (
    BCSError,
    ConfigError,
    UnsupportedMediaType,
)
from ..outbound.transport import Transport

Mode = Literal["bcs", "kubernetes", "auto"]
StartResponse = Callable[..., Any]

Canonical = Callable[[str, str, Any], Any]
#: One admitted body may cost at most this many times ``max_body`` once decoded (estimated
#: before decoding, :func:`~bcs_middleware.core.bodies.decoded_cost`): more is a 413.
REQUEST_COST_FACTOR = 12
#: What a process's admission layer holds at once, by estimate, unless configured (at least two
#: requests at their limit).
DEFAULT_BUFFER_MEMORY = 128 * 1024 * 1024


def _as_read(method: str, path: str, document: Any) -> Any:
    return document


class AdmissionMiddleware:
    """Run matching admission webhooks before a create/update reaches ``app`` (see module doc)."""

    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        *,
        store: DefinitionStore,
        cluster_reader: ClusterReader | None = None,
        mode: Mode = "auto",
        max_body: int = 3 * 1024 * 1024,
        total_budget: float = 15.0,
        default_timeout: float = 10.0,
        address_map: Mapping[str, str] | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        client: WebhookClient | None = None,
        namespace_ttl: float = 5.0,
        transport: Transport | None = None,
        buffer_memory: int | None = None,
        buffer_wait: float = 30.0,
        canonical: Canonical | None = None,
    ) -> None:
        if mode not in ("bcs", "kubernetes", "auto"):
            raise ValueError(f"mode must be bcs, kubernetes or auto, not {mode!r}")
        if max_body <= 0 or total_budget <= 0 or default_timeout <= 0:
            raise ValueError("max_body, total_budget and default_timeout must be positive")
        self.app = app
        self.mode = mode
        self.max_body = max_body
        request_limit = REQUEST_COST_FACTOR * max_body
        self.budget = BufferBudget(buffer_memory or max(DEFAULT_BUFFER_MEMORY, 2 * request_limit), request_limit,
                                   buffer_wait, what="admission")
        self.canonical = canonical or _as_read
        client = client or WebhookClient(
            transport=transport,
            address_map=address_map or {},
            breaker=CircuitBreaker(breaker_threshold, breaker_cooldown),
        )
        self.engine = AdmissionEngine(
            store,
            client=client,
            cluster_reader=cluster_reader,
            total_budget=total_budget,
            default_timeout=default_timeout,
            namespace_ttl=namespace_ttl,
        )
        self.kubernetes = KubernetesAdmission(self.engine, max_body=max_body)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        try:
            # The request as kube-apiserver classifies it, decided once, in the request's facts.
            facts = request_facts.of(environ)
            cluster_id = self._kubernetes_cluster(environ, facts)
        except BCSError as exc:  # an unsafe tunnel path, refused as routing refuses it
            return exc(environ, start_response)
        info = facts.info if cluster_id is not None else None
        if info is not None:
            if info.admission_operation is None:
                return self.app(environ, start_response)  # get, list, watch, logs: nothing to admit
        elif method not in ("POST", "PUT") or (facts.route is not None and facts.route.definitions):
            # bcs definitions know Create and Update only; no webhook intercepts a change to
            # webhook definitions, or one that refused them could never be removed
            # (bcs_middleware.core.routes names those routes).
            return self.app(environ, start_response)
        style: env.ErrorStyle = "kubernetes" if info is not None else env.get_error_style(environ)
        slot = self.budget.claim()
        try:
            if info is not None and cluster_id is not None:
                outcome = self.kubernetes.admit(environ, method, cluster_id, info, slot=slot)
            else:
                outcome = self._admit_bcs(environ, method, slot=slot)
        except BCSError as exc:
            slot.release()
            status_line, headers, payload = exc.response_parts(style)
            start_response(status_line, headers)
            return [payload]
        except BaseException:
            slot.release()
            raise
        respond = start_response
        if outcome is not None:
            environ[env.ADMISSION] = outcome.result()
            extra = warning_headers(outcome.warnings)
            if extra:
                def respond(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                    return start_response(status, [*headers, *extra], exc_info)
        if not slot.held:
            return self.app(environ, respond)
        # The buffered body and its object live until the response ends: so does the slot.
        try:
            return slot.until_done(self.app(environ, respond))
        except BaseException:
            slot.release()
            raise

    # -- bcs ------------------------------------------------------------------------

    def _admit_bcs(self, environ: dict[str, Any], method: str, *, slot: BufferBudget.Slot) -> Outcome | None:
        if method not in ("POST", "PUT"):
            return None
        operation: Literal["Create", "Update"] = "Create" if method == "POST" else "Update"
        kinds = self.engine.bcs_kinds(operation)
        if not kinds:
            return None  # no definition for this operation: nothing can match, the body streams on
        content_type = _mime(environ)
        is_yaml = "yaml" in content_type
        if content_type and "json" not in content_type and not is_yaml:
            if not has_body(environ):
                return None
            # An application behind the filter may parse it anyway: never pass it unjudged.
            raise UnsupportedMediaType(
                f'a {gojson.printable(content_type, 100)} body cannot be admitted by webhook '
                f'"{self._bcs_webhook(operation)}": send JSON (application/json) or YAML (application/yaml)'
            )
        slot.reserve_for(environ, self.max_body)
        body = read_buffer(environ, self.max_body, what="a request body to admit")
        if not body or (not is_yaml and b"\\u" not in body
                        and not any(kind.encode() in body.lower() for kind in kinds)):
            # Empty, or JSON that mentions no covered kind (which lower-case ASCII letters
            # only spell: no \u escape, and no other character lower-cases to them): no
            # definition can match, so nothing is judged and the bytes go on as sent.
            replace_body(environ, bytes(body))
            slot.release()
            return None
        path = environ.get("PATH_INFO", "")
        document = (parse_yaml(bytes(body), max_nodes=yaml_node_limit(self.budget.request_limit)) if is_yaml
                    else parse_json(body, measure=slot.fit))
        del body
        document = self.canonical(method, path, document)
        outcome = self.engine.admit_bcs(
            operation, document, env.get_user(environ),
            canonical=lambda answer: self.canonical(method, path, answer))
        # What the receiver gets is what was admitted, re-encoded, whether or not a webhook changed it.
        replace_body(environ, outcome.encoding(), content_type="application/json")
        environ[env.DOCUMENT] = env.Document(outcome.object)
        if not outcome.webhooks and not outcome.steps:
            return None
        return outcome

    def _bcs_webhook(self, operation: str) -> str:
        """A webhook a request of ``operation`` could meet (the first, by kind), for messages."""
        for (op, _), definition in sorted(self.engine.bcs_definitions().items()):
            if op == operation and definition.webhooks:
                return f"{definition.name}/{definition.webhooks[0].name}"
        return operation

    # -- Kubernetes -------------------------------------------------------------------

    def _kubernetes_cluster(self, environ: dict[str, Any], facts: request_facts.RequestFacts) -> str | None:
        """The cluster whose Kubernetes definitions apply (``""``: none named), else ``None``.

        Behind routing the cluster is ``bcs.cluster``; without routing in front (a pipeline
        in ``kubernetes`` mode) it is the Kubernetes route's, from the request's facts.
        """
        cluster = env.get_cluster(environ)
        if self.mode == "bcs" or (
            self.mode == "auto" and (cluster is None or cluster.cluster_type != "k8s")
        ):
            return None
        if cluster is not None:
            return cluster.id
        facts.refuse()
        return facts.cluster_id if facts.cluster_id is not None else ""

def _mime(environ: Mapping[str, Any]) -> str:
    return str(environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()


def _mode(value: str) -> Mode:
    value = value.strip().lower()
    if value not in ("bcs", "kubernetes", "auto"):
        raise ValueError("must be bcs, kubernetes or auto")
    return value  # type: ignore[return-value]


_OPTIONS: dict[str, Converter] = {
    "definitions_file": text,
    "database_url": text,
    "secret_key": text,
    "mode": _mode,
    "max_body": size,
    "total_budget": seconds,
    "default_timeout": seconds,
    "address_map": mapping,
    "breaker_threshold": asint,
    "breaker_cooldown": seconds,
    "namespace_ttl": seconds,
    "buffer_memory": size,
    "buffer_wait": seconds,
}


def filter_factory(
    global_conf: Mapping[str, Any], **local_conf: str
) -> Callable[[Any], AdmissionMiddleware]:
    """PasteDeploy filter ``admission``.

    .. code-block:: ini

        [filter:admission]
        use = egg:bcs-middleware#admission
        # JSON or YAML: {"admissionwebhooks": [...], "clusters": {"<id>": [...]}}
        definitions_file = /etc/bcs/admission.yaml
        # ... or the gateway's database (definitions managed through its REST API;
        # Kubernetes definitions then read namespaces/objects with the cluster's credentials)
        # database_url = postgresql://bcs@db/bcs
        mode = auto
        max_body = 3MiB
        # estimated memory of the bodies buffered at once (429 beyond, after buffer_wait)
        buffer_memory = 128MiB
        buffer_wait = 30s
        total_budget = 15s
        default_timeout = 10s
        breaker_threshold = 5
        breaker_cooldown = 30s
        address_map =
            sidecar-webhook-service.sidecar-webhook-namespace = 10.0.0.12:8443
    """
    options = convert_options("filter:admission", local_conf, _OPTIONS)
    store = _definition_store(options)

    def make(app: Any) -> AdmissionMiddleware:
        return AdmissionMiddleware(app, store=store, **options)

    return make


def _definition_store(options: dict[str, Any]) -> DefinitionStore:
    """The store ``definitions_file`` or ``database_url`` names (popped from ``options``), else an
    empty one; a database also gives the engine its cluster reader (the cluster's credentials)."""
    path = options.pop("definitions_file", None)
    database_url = options.pop("database_url", None)
    secret_key = options.pop("secret_key", None)
    if path and database_url:
        raise ConfigError("[filter:admission] definitions_file and database_url exclude each other")
    if not database_url:
        return load_definitions_file(path) if path else MemoryDefinitionStore()
    from ..clusters.directory import CachedDirectory
    from ..clusters.reader import TunnelClusterReader
    from ..outbound.transport import default_transport
    from ..store.definitions import SQLDefinitionStore
    from ..store.sql import open_store

    sql = open_store(database_url, secret_key=secret_key, migrate=False)
    store = SQLDefinitionStore(sql)
    options.setdefault("cluster_reader", TunnelClusterReader(CachedDirectory(sql), default_transport()))
    return store
