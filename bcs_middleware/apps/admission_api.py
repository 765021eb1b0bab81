"""CRUD of webhook definitions, and the dry-run review, as one WSGI app.

Routes (all JSON; ``{p}`` is the mount prefix):

* ``POST|PUT {p}/mesosdriver/v4/namespaces/{ns}/admissionwebhook`` — create / update (bcs)
* ``GET|DELETE {p}/mesosdriver/v4/namespaces/{ns}/admissionwebhook/{name}``
* ``GET {p}/mesosdriver/v4/admissionwebhooks`` — list
* ``GET|POST {p}/rest/admissionwebhooks``, ``GET|PUT|DELETE {p}/rest/admissionwebhooks/{name}``
* ``GET|POST {p}/rest/clusters/{id}/admissionwebhookconfigurations`` (Kubernetes form)
* ``GET|PUT|DELETE {p}/rest/clusters/{id}/admissionwebhookconfigurations/{kind}/{name}``
* ``POST {p}/rest/admission/review`` — dry-run admission (:func:`bcs_middleware.admission.dry_run.review`)

``{kind}`` is ``mutatingwebhookconfigurations`` or ``validatingwebhookconfigurations``
(the Kind names are accepted too). Bodies are validated by JSON Schema; a bad
field, a missing or undecodable ``caBundle`` is a 400 naming the field; a second
bcs definition for the same (operation, kind) is a 409.

With ``require_superuser`` (the default) every route needs ``bcs.user`` to be a
superuser (set by the token auth layer in front): 401 without a user, 403 for
others — except that, given ``cluster_access``, a user holding ``edit`` on a
cluster manages that cluster's Kubernetes configurations (a user who may not see
the cluster gets the 404 of a cluster that does not exist, one with ``view`` 403).
The gateway-wide bcs definitions and the review stay superuser-only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from ..admission.client import WebhookClient
from ..admission.definitions import (
    MUTATING,
    VALIDATING,
    BcsDefinition,
    ClientConfig,
    K8sConfiguration,
    parse_bcs_definition,
    parse_k8s_configuration,
)
from ..admission.dry_run import review
from ..admission.engine import AdmissionEngine
from ..admission.store import DefinitionStore
from ..clusters.permissions import EDIT, ClusterAccess
from ..core import environ as env
from ..core.bodies import parse_json
from ..core.errors import (
    BadRequest,
    BCSError,
    Conflict,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    ValidationError,
)
from ..core.quotas import Quotas
from ..outbound.addresses import AddressPolicy
from ..outbound.transport import Transport

MAX_BODY = 1024 * 1024
_KINDS = {
    "mutatingwebhookconfigurations": MUTATING,
    "mutatingwebhookconfiguration": MUTATING,
    "validatingwebhookconfigurations": VALIDATING,
    "validatingwebhookconfiguration": VALIDATING,
}


class AdmissionWebhookAPI:
    """WSGI app serving the definition CRUD routes and ``POST /rest/admission/review``.

    :param store: the :class:`~bcs_middleware.admission.DefinitionStore`.
    :param engine: the engine the review endpoint runs (share the admission
        layer's: ``AdmissionWebhookAPI(store, engine=layer.engine)``); one with a
        default client is made if omitted.
    :param require_superuser: refuse every route to non-superusers.
    :param cluster_access: with ``require_superuser``, let ``edit`` holders of a
        cluster manage its Kubernetes configurations (the gateway passes its
        :class:`~bcs_middleware.clusters.permissions.ClusterAuthorizer`).
    :param prefix: mounted under this path prefix (e.g. ``""`` or ``"/bcsapi/v4"``).
    :param address_policy: the gateway's upstream address policy: a webhook URL whose host
        is an IP address it refuses is refused when defined (422), not only when called.
    :param transport: the outbound transport of a default engine's webhook client.
    :param quotas: bounds the definitions a non-superuser creates per cluster
        (``webhook_configurations_per_cluster``); ``None``: unbounded.
    """

    def __init__(
        self,
        store: DefinitionStore,
        *,
        engine: AdmissionEngine | None = None,
        require_superuser: bool = True,
        cluster_access: ClusterAccess | None = None,
        prefix: str = "",
        address_policy: AddressPolicy | None = None,
        transport: Transport | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.store = store
        self.quotas = quotas
        self.engine = engine or AdmissionEngine(store, client=WebhookClient(transport=transport))
        self.address_policy = address_policy
        self.require_superuser = require_superuser
        self.cluster_access = cluster_access
        p = prefix.rstrip("/")
        self.url_map = Map(
            [
                Rule(f"{p}/mesosdriver/v4/namespaces/<ns>/admissionwebhook",
                     methods=["POST", "PUT"], endpoint="mesos_put"),
                Rule(f"{p}/mesosdriver/v4/namespaces/<ns>/admissionwebhook/<name>",
                     methods=["GET", "DELETE"], endpoint="mesos_item"),
                Rule(f"{p}/mesosdriver/v4/admissionwebhooks", methods=["GET"], endpoint="bcs_list"),
                Rule(f"{p}/rest/admissionwebhooks", methods=["GET", "POST"], endpoint="rest_bcs"),
                Rule(f"{p}/rest/admissionwebhooks/<name>", methods=["GET", "PUT", "DELETE"],
                     endpoint="rest_bcs_item"),
                Rule(f"{p}/rest/clusters/<cluster_id>/admissionwebhookconfigurations",
                     methods=["GET", "POST"], endpoint="k8s"),
                Rule(f"{p}/rest/clusters/<cluster_id>/admissionwebhookconfigurations/<kind>/<name>",
                     methods=["GET", "PUT", "DELETE"], endpoint="k8s_item"),
                Rule(f"{p}/rest/admission/review", methods=["POST"], endpoint="review"),
            ],
            strict_slashes=False,
        )

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        request = Request(environ)
        try:
            try:
                endpoint, args = self.url_map.bind_to_environ(environ).match()
            except HTTPException as exc:
                if exc.code == 405:
                    raise MethodNotAllowed(f"{request.method} is not allowed here") from None
                raise NotFound("no such route") from None
            self._authorize(environ, args.get("cluster_id") if endpoint in ("k8s", "k8s_item") else None)
            handler: Callable[..., Response] = getattr(self, f"_{endpoint}")
            response = handler(request, **args)
        except BCSError as exc:
            return exc(environ, start_response)
        return response(environ, start_response)

    def _authorize(self, environ: dict[str, Any], cluster_id: str | None) -> None:
        if not self.require_superuser:
            return
        user = env.get_user(environ)
        if user is None:
            raise Unauthorized()
        if user.is_superuser:
            return
        if cluster_id is not None and self.cluster_access is not None:
            self.cluster_access.require(user, cluster_id, EDIT)
            return
        raise Forbidden("only superusers manage admission webhooks")

    # -- bcs definitions ----------------------------------------------------------------

    def _mesos_put(self, request: Request, ns: str) -> Response:
        definition = parse_bcs_definition(_body(request), namespace=ns)
        return self._save_bcs(request, definition, create=request.method == "POST")

    def _mesos_item(self, request: Request, ns: str, name: str) -> Response:
        definition = self.store.get_bcs(name)
        if definition is None or definition.namespace != ns:
            raise NotFound(f"admissionwebhook {name!r} not found in namespace {ns!r}")
        if request.method == "DELETE":
            self.store.delete_bcs(name)
        return _json(_bcs_doc(definition))

    def _bcs_list(self, request: Request) -> Response:
        return _json({"items": [_bcs_doc(d) for d in self.store.list_bcs()]})

    def _rest_bcs(self, request: Request) -> Response:
        if request.method == "GET":
            return self._bcs_list(request)
        return self._save_bcs(request, parse_bcs_definition(_body(request)), create=True)

    def _rest_bcs_item(self, request: Request, name: str) -> Response:
        if request.method == "PUT":
            definition = parse_bcs_definition(_body(request))
            if definition.name != name:
                raise BadRequest("metadata.name: must match the name in the path")
            return self._save_bcs(request, definition, create=False)
        found = self.store.get_bcs(name)
        if found is None:
            raise NotFound(f"admissionwebhook {name!r} not found")
        if request.method == "DELETE":
            self.store.delete_bcs(name)
        return _json(_bcs_doc(found))

    def _check_addresses(self, clients: Iterable[ClientConfig]) -> None:
        """Refuse a webhook URL at an IP address the gateway never connects to.

        An early, clear answer (as for reported apiserver addresses); a host name is
        judged when the webhook is called, by the transport's address policy.
        """
        if self.address_policy is None:
            return
        for client in clients:
            if not client.url:
                continue
            parts = urlsplit(client.url)
            refused = self.address_policy.literal_refusal(parts.hostname or "", parts.port or 443)
            if refused:
                raise ValidationError(f"clientConfig.url: the gateway does not connect to {refused}")

    def _limit(self, request: Request) -> int | None:
        if self.quotas is None:
            return None
        return self.quotas.limit("webhook_configurations_per_cluster", env.get_user(request.environ))

    def _save_bcs(self, request: Request, definition: BcsDefinition, *, create: bool) -> Response:
        self._check_addresses(w.client for w in definition.webhooks)
        exists = self.store.get_bcs(definition.name) is not None
        if create and exists:
            raise Conflict(f"admissionwebhook {definition.name!r} already exists")
        if not create and not exists:
            raise NotFound(f"admissionwebhook {definition.name!r} not found")
        self.store.put_bcs(definition, limit=self._limit(request))
        return _json(_bcs_doc(definition), 201 if create else 200)

    # -- Kubernetes configurations ---------------------------------------------------------

    def _k8s(self, request: Request, cluster_id: str) -> Response:
        if request.method == "GET":
            items = [dict(c.document) for c in self.store.list_k8s(cluster_id)]
            return _json({"items": items})
        configuration = parse_k8s_configuration(_body(request))
        self._check_addresses(w.client for w in configuration.webhooks)
        if self.store.get_k8s(cluster_id, configuration.kind, configuration.name) is not None:
            raise Conflict(f"{configuration.kind} {configuration.name!r} already exists")
        self.store.put_k8s(cluster_id, configuration, limit=self._limit(request))
        return _json(dict(configuration.document), 201)

    def _k8s_item(self, request: Request, cluster_id: str, kind: str, name: str) -> Response:
        kind_name = _KINDS.get(kind.lower())
        if kind_name is None:
            raise NotFound(f"unknown configuration kind {kind!r}")
        found = self.store.get_k8s(cluster_id, kind_name, name)
        if request.method == "PUT":
            configuration: K8sConfiguration = parse_k8s_configuration(_body(request))
            self._check_addresses(w.client for w in configuration.webhooks)
            if (configuration.kind, configuration.name) != (kind_name, name):
                raise BadRequest("kind and metadata.name: must match the path")
            if found is None:
                raise NotFound(f"{kind_name} {name!r} not found")
            self.store.put_k8s(cluster_id, configuration)
            return _json(dict(configuration.document))
        if found is None:
            raise NotFound(f"{kind_name} {name!r} not found")
        if request.method == "DELETE":
            self.store.delete_k8s(cluster_id, kind_name, name)
        return _json(dict(found.document))

    # -- review -----------------------------------------------------------------------------

    def _review(self, request: Request) -> Response:
        return _json(review(self.engine, _body(request), env.get_user(request.environ)))


class ClusterDefinitionsAPI:
    """The bcs definition routes for one Mesos cluster at a time: the one in ``bcs.cluster``.

    The gateway mounts it behind its Mesos route (``/bcsapi/v4/scheduler/mesos/…``,
    path rewritten under ``/mesosdriver/v4/``), which has already checked that the
    caller may manage that cluster; so this app authorizes nothing itself and must
    never be reachable otherwise. Each cluster's definitions live in the store
    under its id; its drivers read them from the same database (see
    :class:`~bcs_middleware.store.definitions.SQLDefinitionStore`).

    :param store_for: the definition store of one cluster's own bcs definitions.
    :param engine: passed to each cluster's :class:`AdmissionWebhookAPI`.
    :param max_clusters: how many clusters' APIs are kept built.
    :param quotas: bounds each cluster's definitions (as :class:`AdmissionWebhookAPI`'s).
    """

    def __init__(self, store_for: Callable[[str], DefinitionStore], *, engine: AdmissionEngine | None = None,
                 max_clusters: int = 1024, quotas: Quotas | None = None) -> None:
        self.store_for = store_for
        self.engine = engine
        self.max_clusters = max_clusters
        self.quotas = quotas
        self._apis: dict[str, AdmissionWebhookAPI] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        cluster = env.get_cluster(environ)
        if cluster is None:
            return NotFound("no cluster")(environ, start_response)
        api = self._apis.get(cluster.id)
        if api is None:
            store = self.store_for(cluster.id)
            if self.engine is None:
                self.engine = AdmissionEngine(store, client=WebhookClient())
            api = AdmissionWebhookAPI(store, engine=self.engine, require_superuser=False, quotas=self.quotas)
            while len(self._apis) >= self.max_clusters:
                self._apis.pop(next(iter(self._apis)))
            self._apis[cluster.id] = api
        return api(environ, start_response)


def _bcs_doc(definition: BcsDefinition) -> dict[str, Any]:
    return dict(definition.document)


def _body(request: Request) -> Any:
    length = request.content_length
    if length is not None and length > MAX_BODY:
        raise PayloadTooLarge(f"body larger than {MAX_BODY} bytes")
    data = request.stream.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise PayloadTooLarge(f"body larger than {MAX_BODY} bytes")
    return parse_json(data, what="(body)")


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")
