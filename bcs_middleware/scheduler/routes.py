"""Which driver request becomes which bcs-scheduler call — the source driver's router, as a table.

The source's mesos-driver (``backend/v4http/scheduler-api.go``) serves
``/mesosdriver/v4/{route}`` and calls the scheduler's ``/v1`` API; this table
holds those routes (method, path template) and the call each one makes::

    POST   namespaces/{ns}/applications             → POST   /v1/apps  (Version)
    PUT    namespaces/{ns}/applications             → POST   /v1/apps/{RunAs}/{ID}/update?instances=&args=
    PUT    namespaces/{ns}/applications/rollback    → POST   /v1/apps/{RunAs}/{ID}/update?instances={Instances}&kind=…
    DELETE namespaces/{ns}/applications/{name}      → DELETE /v1/apps/{ns}/{name}?enforce=&kind=application
    PUT    namespaces/{ns}/applications/{name}/scale/{n} → POST /v1/apps/{ns}/{name}/scale?instances={n}&kind=…
    GET    namespaces/{ns}/applications[/{name}]       → GET    /v1/{ns}/apps?kind=… | /v1/apps/{ns}/{name}?kind=…
    GET    namespaces/{ns}/applications/{name}/tasks|taskgroups|versions → GET /v1/apps/{ns}/{name}/…
    (processes: the same, kind=process)
    POST   namespaces/{ns}/deployments                 → POST   /v1/deployment/{ns}/{name}      DeploymentDef
    PUT    namespaces/{ns}/deployments                 → PUT    /v1/deployment/{ns}/{name}?args=   DeploymentDef
    DELETE namespaces/{ns}/deployments/{name}          → DELETE /v1/deployment/{ns}/{name}?enforce=
    PUT    namespaces/{ns}/deployments/{name}/cancelupdate|pauseupdate|resumeupdate → POST /v1/deployment/{ns}/{name}/…
    PUT    namespaces/{ns}/deployments/{name}/scale/{n} → PUT   /v1/deployment/{ns}/{name}/scale/{n}
    POST|PUT namespaces/{ns}/configmaps|secrets|services → POST|PUT /v1/configmap|secret|service  (body as sent)
    DELETE namespaces/{ns}/configmaps|secrets|services/{name} → DELETE /v1/configmap|…/{ns}/{name}
    GET    cluster/resources|endpoints|current/offers, definition/application|deployment/{ns}/{name}
                                                       → GET    /v1/{same path}
    GET    namespaces/{ns}/applications/{name}/versions/{id} → GET /v1/apps/{ns}/{name}/versions/{id}
    POST   namespaces/{ns}/applications/{name}[/taskgroups/{tg}]/message
                                                       → POST   /v1/apps/{ns}/{name}/message[/{tg}]  BcsMessage
    PUT    namespaces/{ns}/applications/{app}/taskgroups/{tg}/rescheduler
                                                       → PUT    /v1/taskgroup/{tg}/rescheduler?hostRetainTime=
    POST   namespaces/{ns}/applications/{app}/taskgroups/{tg}/restart|reload → POST /v1/taskgroup/{tg}/…
    POST   namespaces/{ns}/daemonset                   → POST   /v1/daemonsets  BcsDaemonsetDef
    DELETE namespaces/{ns}/daemonset/{name}            → DELETE /v1/daemonsets/{ns}/{name}?enforce=
    GET    transactions/{ns}, DELETE transactions/{ns}/{name} → /v1/transactions/… (?objKind=&objName=)
    GET    agentsettings → GET ?ips=; DELETE agentsettings → POST /v1/agentsettings/delete?ips=;
    POST   agentsettings[/enable|/disable], PUT agentsettings/taint|extendedresource → /v1/agentsettings/…
    *      crr/register, crd/…, image/commit/{tg}, command/application|deployment/{ns}/{name}
                                                       → the same path under /v1/ (bodies as sent)
    *      customresourcedefinitions…, customresources… → 404 (the source's kubeconfig mode, not provided)

(``{ns}``/``{name}`` of a create/update come from the body's ``metadata``, as
in the source.) Create, update and rollback bodies are checked for their
``kind`` first (``util.CheckKind``). What the table does not hold is not
converted: the driver forwards it as it always did (``{scheduler_prefix}{uri}``).

Each route with a body names the Go type the source decodes it into
(:mod:`.v4fields`); :func:`canonical` decodes a body into it as Go does (keys in
the tags' spelling, case variants merged), and that document is what admission
judges, what is converted and what the scheduler receives. Bodies of routes the
table does not hold are read as plain JSON (duplicate keys refused), keys as sent.

Differences from the source, on purpose: query values and path segments taken
from the body are percent-encoded (the source concatenated them, so a name
could add query parameters or path segments), a scale count must be a
non-negative integer (400), and bodies relayed "as sent" are the document
admission judged, re-encoded. README's "Mesos driver" section has the full table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from ..core import gojson
from ..core.errors import BadRequest, NotFound
from ..core.gotypes import GoType, GoTypeError, Ptr, decode
from . import convert, v4fields
from .convert import (
    APPLICATION,
    BCS_JSON_DECODE,
    CONFIGMAP,
    DAEMONSET,
    DEPLOYMENT,
    PROCESS,
    SECRET,
    SERVICE,
    ConversionError,
)


@dataclass(frozen=True)
class SchedulerCall:
    """One request to the scheduler: method, percent-encoded path, query, JSON body (``None``: no body)."""

    method: str
    path: str
    query: str = ""
    body: bytes | None = None


Body = Callable[[], Any]  # reads and parses the request body (bounded) on demand
Handler = Callable[[dict[str, str], dict[str, str], Body], SchedulerCall]


def _seg(value: str) -> str:
    if not value or value in (".", ".."):
        raise BadRequest("a name or namespace is empty or a dot segment", code_name="BAD_PARAMETER")
    return quote(value, safe="")


def _json(value: Any) -> bytes:
    return gojson.dumps(value)


def _count(value: str) -> str:
    if not value.isdigit() or len(value) > 9:
        raise ConversionError(f"instances {value!r} is not a number", code_name="BAD_INSTANCES")
    return str(int(value))


def _app_create(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        doc = body()
        convert.check_kind(doc, kind)
        return SchedulerCall("POST", "/v1/apps", body=_json(convert.version_from_application(doc)))
    return handle


def _app_update(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        doc = body()
        convert.check_kind(doc, kind)
        version = convert.version_from_application(doc)
        return SchedulerCall("POST", f"/v1/apps/{_seg(version['RunAs'])}/{_seg(version['ID'])}/update",
                             urlencode({"instances": query.get("instances", ""), "args": query.get("args", "")}),
                             _json(version))
    return handle


def _app_rollback(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        doc = body()
        convert.check_kind(doc, kind)
        version = convert.version_from_application(doc)
        return SchedulerCall("POST", f"/v1/apps/{_seg(version['RunAs'])}/{_seg(version['ID'])}/update",
                             urlencode({"instances": version["Instances"], "kind": kind}), _json(version))
    return handle


def _app_delete(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        return SchedulerCall("DELETE", f"/v1/apps/{params['ns']}/{params['name']}",
                             urlencode({"enforce": query.get("enforce", ""), "kind": kind}))
    return handle


def _app_scale(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        return SchedulerCall("POST", f"/v1/apps/{params['ns']}/{params['name']}/scale",
                             urlencode({"instances": _count(params["n"]), "kind": kind}))
    return handle


def _app_list(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        return SchedulerCall("GET", f"/v1/{params['ns']}/apps", urlencode({"kind": kind}))
    return handle


def _app_fetch(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        return SchedulerCall("GET", f"/v1/apps/{params['ns']}/{params['name']}", urlencode({"kind": kind}))
    return handle


def _app_sub(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    return SchedulerCall("GET", f"/v1/apps/{params['ns']}/{params['name']}/{params['sub']}")


def _deployment_write(method: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        doc = body()
        convert.check_kind(doc, DEPLOYMENT)
        definition = convert.deployment_def(doc)
        meta = definition["metadata"]
        path = f"/v1/deployment/{_seg(meta['namespace'])}/{_seg(meta['name'])}"
        return SchedulerCall(method, path, urlencode({"args": query.get("args", "")}) if method == "PUT" else "",
                             _json(definition))
    return handle


def _deployment_delete(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    return SchedulerCall("DELETE", f"/v1/deployment/{params['ns']}/{params['name']}",
                         urlencode({"enforce": query.get("enforce", "")}))


def _deployment_action(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    return SchedulerCall("POST", f"/v1/deployment/{params['ns']}/{params['name']}/{params['action']}")


def _deployment_scale(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    return SchedulerCall("PUT", f"/v1/deployment/{params['ns']}/{params['name']}/scale/{_count(params['n'])}")


def _plain_write(kind: str, method: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        doc = body()
        convert.check_kind(doc, kind)
        return SchedulerCall(method, f"/v1/{kind}", body=_json(doc))
    return handle


def _plain_delete(kind: str) -> Handler:
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        return SchedulerCall("DELETE", f"/v1/{kind}/{params['ns']}/{params['name']}")
    return handle


def _same_path(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    return SchedulerCall("GET", "/v1/" + params["path"])


def _message(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    path = f"/v1/apps/{params['ns']}/{params['name']}/message"
    if params.get("taskgroup"):
        path += f"/{params['taskgroup']}"
    return SchedulerCall("POST", path, body=_json(convert.bcs_message(body())))


def _daemonset_create(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    doc = body()
    convert.check_kind(doc, DAEMONSET)
    return SchedulerCall("POST", "/v1/daemonsets", body=_json(convert.daemonset_def(doc)))


def _call(method: str, template: str, *, queries: tuple[str, ...] = (), with_body: bool = False) -> Handler:
    """A call the source builds from path parameters and named query values (each sent, empty
    when absent, as the source's concatenation does), with the client's JSON body when
    ``with_body`` (the source relays it unchanged; here it is the document admission read)."""
    def handle(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
        path = template.format(**params)
        query_string = urlencode({name: query.get(name, "") for name in queries})
        return SchedulerCall(method, path, query_string, _json(body()) if with_body else None)
    return handle


def _not_served(params: dict[str, str], query: dict[str, str], body: Body) -> SchedulerCall:
    raise NotFound("custom resources need the source driver's kubeconfig mode, which this driver does not "
                   "provide", code_name="NOT_SERVED")


_SEG = r"[^/]+"


Route = tuple[str, "re.Pattern[str]", Handler, GoType | None]


def _route(method: str, template: str, handler: Handler, body: GoType | None = None) -> Route:
    pattern = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{_SEG})", template)
    return method, re.compile(pattern + "/?"), handler, body


def _table() -> list[Route]:
    routes = []
    rc = v4fields.REPLICA_CONTROLLER
    for plural, kind in (("applications", APPLICATION), ("processes", PROCESS)):
        base = f"namespaces/{{ns}}/{plural}"
        routes += [
            _route("POST", base, _app_create(kind), rc),
            _route("PUT", f"{base}/rollback", _app_rollback(kind), rc),  # before {name}: "rollback" is not a name
            _route("PUT", base, _app_update(kind), rc),
            _route("DELETE", f"{base}/{{name}}", _app_delete(kind)),
            _route("PUT", f"{base}/{{name}}/scale/{{n}}", _app_scale(kind)),
            _route("GET", base, _app_list(kind)),
            _route("GET", f"{base}/{{name}}", _app_fetch(kind)),
        ]
    routes.append(_route("GET", "namespaces/{ns}/applications/{name}/(?P<sub>tasks|taskgroups|versions)", _app_sub))
    routes += [
        _route("POST", "namespaces/{ns}/deployments", _deployment_write("POST"), v4fields.BCS_DEPLOYMENT),
        _route("PUT", "namespaces/{ns}/deployments", _deployment_write("PUT"), v4fields.BCS_DEPLOYMENT),
        _route("DELETE", "namespaces/{ns}/deployments/{name}", _deployment_delete),
        _route("PUT", "namespaces/{ns}/deployments/{name}/(?P<action>cancelupdate|pauseupdate|resumeupdate)",
               _deployment_action),
        _route("PUT", "namespaces/{ns}/deployments/{name}/scale/{n}", _deployment_scale),
    ]
    for plural, kind, gotype in (("configmaps", CONFIGMAP, v4fields.BCS_CONFIG_MAP),
                                 ("secrets", SECRET, v4fields.BCS_SECRET),
                                 ("services", SERVICE, v4fields.BCS_SERVICE)):
        routes += [
            _route("POST", f"namespaces/{{ns}}/{plural}", _plain_write(kind, "POST"), gotype),
            _route("PUT", f"namespaces/{{ns}}/{plural}", _plain_write(kind, "PUT"), gotype),
            _route("DELETE", f"namespaces/{{ns}}/{plural}/{{name}}", _plain_delete(kind)),
        ]
    routes.append(_route("GET", r"(?P<path>cluster/(resources|endpoints|current/offers)"
                                r"|definition/(application|deployment)/[^/]+/[^/]+)", _same_path))
    app = "namespaces/{ns}/applications/{name}"
    routes += [
        _route("POST", f"{app}/message", _message, v4fields.SEND_MSG_OPE_PARAM),
        _route("POST", f"{app}/taskgroups/{{taskgroup}}/message", _message, v4fields.SEND_MSG_OPE_PARAM),
        # The scheduler addresses a taskgroup by its id alone: the namespace and application are not sent.
        _route("PUT", f"{app}/taskgroups/{{tg}}/rescheduler",
               _call("PUT", "/v1/taskgroup/{tg}/rescheduler", queries=("hostRetainTime",))),
        _route("POST", f"{app}/taskgroups/{{tg}}/(?P<action>restart|reload)",
               _call("POST", "/v1/taskgroup/{tg}/{action}")),
        _route("GET", f"{app}/versions/{{version}}", _call("GET", "/v1/apps/{ns}/{name}/versions/{version}")),
        _route("POST", "namespaces/{ns}/daemonset", _daemonset_create, v4fields.BCS_DAEMONSET),
        _route("DELETE", "namespaces/{ns}/daemonset/{name}",
               _call("DELETE", "/v1/daemonsets/{ns}/{name}", queries=("enforce",))),
        _route("GET", "transactions/{ns}", _call("GET", "/v1/transactions/{ns}", queries=("objKind", "objName"))),
        _route("DELETE", "transactions/{ns}/{name}", _call("DELETE", "/v1/transactions/{ns}/{name}")),
        _route("GET", "agentsettings", _call("GET", "/v1/agentsettings", queries=("ips",))),
        # The source's DELETE becomes a POST to a route the scheduler has commented out (404 there).
        _route("DELETE", "agentsettings", _call("POST", "/v1/agentsettings/delete", queries=("ips",))),
        _route("POST", "agentsettings", _call("POST", "/v1/agentsettings", with_body=True), v4fields.AGENT_SETTINGS),
        _route("POST", "agentsettings/(?P<action>enable|disable)",
               _call("POST", "/v1/agentsettings/{action}", queries=("ips",))),
        _route("PUT", "agentsettings/taint", _call("PUT", "/v1/agentsettings/taint", with_body=True),
               v4fields.AGENT_SETTINGS),
        _route("PUT", "agentsettings/extendedresource",
               _call("PUT", "/v1/agentsettings/extendedresource", with_body=True), Ptr(v4fields.EXTENDED_RESOURCE)),
        _route("POST", "crr/register", _call("POST", "/v1/crr/register", with_body=True), Ptr(v4fields.CRR)),
        _route("POST", "crd/namespaces/{ns}/{kind}", _call("POST", "/v1/crd/namespaces/{ns}/{kind}", with_body=True),
               Ptr(v4fields.CRD)),
        _route("PUT", "crd/namespaces/{ns}/{kind}", _call("PUT", "/v1/crd/namespaces/{ns}/{kind}", with_body=True),
               Ptr(v4fields.CRD)),
        _route("DELETE", "crd/namespaces/{ns}/{kind}/{name}", _call("DELETE", "/v1/crd/namespaces/{ns}/{kind}/{name}")),
        _route("GET", "crd/namespaces/{ns}/{kind}/{name}", _call("GET", "/v1/crd/namespaces/{ns}/{kind}/{name}")),
        _route("GET", "crd/namespaces/{ns}/{kind}", _call("GET", "/v1/crd/namespaces/{ns}/{kind}")),
        _route("GET", "crd/{kind}", _call("GET", "/v1/crd/{kind}")),
        _route("POST", "image/commit/{taskgroup}",
               _call("POST", "/v1/image/commit/{taskgroup}", queries=("image", "url"))),
    ]
    for target in ("application", "deployment"):
        base = f"command/{target}/{{ns}}/{{name}}"
        routes += [
            _route("POST", base, _call("POST", f"/v1/{base}", with_body=True), v4fields.BCS_COMMAND),
            _route("GET", base, _call("GET", f"/v1/{base}", queries=("id",))),
            _route("DELETE", base, _call("DELETE", f"/v1/{base}", queries=("id",))),
        ]
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        routes.append(_route(method, r"(customresourcedefinitions|customresources)(/.*)?", _not_served))
    return routes


ROUTES = _table()


def _find(method: str, uri: str) -> tuple[Route, dict[str, str]] | None:
    for route in ROUTES:
        if route[0] == method:
            match = route[1].fullmatch(uri)
            if match:
                return route, match.groupdict()
    return None


def body_type(method: str, uri: str) -> GoType | None:
    """The Go type the source decodes the body of ``method uri`` into (``None``: not one it reads)."""
    found = _find(method, uri)
    return found[0][3] if found else None


def canonical(method: str, uri: str, document: Any, *, what: str = "the request body") -> Any:
    """``document`` as the source's driver or scheduler decodes it for ``method uri``: keys in
    the tags' spelling, a field given in several spellings merged as Go merges it
    (:func:`bcs_middleware.core.gotypes.decode`); unchanged for routes that read no v4 type.
    What Go refuses is a 400 with the source's ``BcsErrCommJsonDecode``."""
    gotype = body_type(method, uri)
    if gotype is None:
        return document
    try:
        return decode(document, gotype, what=what)
    except GoTypeError as exc:
        exc.bcs_code = BCS_JSON_DECODE
        raise


def scheduler_call(method: str, uri: str, query_string: str, body: Body) -> SchedulerCall | None:
    """The scheduler call for ``method uri`` (``uri`` percent-encoded, relative to the driver
    prefix), or ``None`` when the source's driver does not convert it. ``body()`` returns the
    request's document as :func:`canonical` made it."""
    found = _find(method, uri)
    if found is None:
        return None
    (_, _, handler, _), params = found
    query = {k: v[0] for k, v in parse_qs(query_string, keep_blank_values=True).items()}
    return handler(params, query, body)
