"""A stand-in for the Mesos scheduler (or a driver): records requests, answers JSON.

Threaded werkzeug server on 127.0.0.1, optionally over TLS. Each answer says
which instance served it, so tests can see where a request went.

``/v1/...`` is the bcs-scheduler's own API (``bcs-scheduler/src/manager/sched/api/routes.go``):
the fake checks what a driver sends there the way the real scheduler decodes it
(a Go ``types.Version`` / ``DeploymentDef``: field names, types, the driver's
defaults) and answers like it — HTTP 200 with the bcs envelope
``{"result","code","message","data"}``, ``result: false`` for a refusal; an
unknown ``/v1`` route is go-restful's ``404: Page Not Found``. Anything else is
echoed as before.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from werkzeug.serving import make_server


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    raw_uri: str = ""

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeScheduler:
    """``FakeScheduler("s1")``; ``requests`` holds what reached it; ``stop()`` when done."""

    def __init__(self, name: str, *, ssl_context: ssl.SSLContext | None = None, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.requests: list[Recorded] = []
        self.apps: dict[tuple[str, str], Any] = {}  # (RunAs, ID) -> Version, as /v1/apps stored it
        self._lock = threading.Lock()
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True, ssl_context=ssl_context)
        self.port = self.server.server_port
        self.scheme = "https" if ssl_context else "http"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        record = Recorded(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                          environ.get("QUERY_STRING", ""), headers, body,
                          environ.get("RAW_URI") or environ.get("REQUEST_URI") or "")
        with self._lock:
            self.requests.append(record)
        if record.path.startswith("/v1/"):
            status, answer = self._v1(record)
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
            return [answer]
        payload = json.dumps({"served_by": self.name, "path": record.path, "query": record.query,
                              "body": record.json() if headers.get("Content-Type", "").startswith(
                                  "application/json") and body else None}).encode()
        start_response(f"{self.status} X", [("Content-Type", "application/json"),
                                            ("Content-Length", str(len(payload)))])
        return [payload]

    def _v1(self, record: Recorded) -> tuple[str, bytes]:
        try:
            route = _match(record.method, record.path)
            if route is None:
                return "404 Not Found", b"404: Page Not Found"
            handler, params = route
            body = json.loads(record.body) if record.body else None
            data = handler(self, params, parse_qs(record.query, keep_blank_values=True), body)
        except Refused as exc:
            return "200 OK", _envelope(exc.code, f"(bcs-scheduler):{exc}")
        return "200 OK", _envelope(0, "success", data)

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.server.shutdown()
            self.server.server_close()


# --- the scheduler's /v1 API -------------------------------------------------------------------

JSON_DECODE, REQUEST_DATA_ERR, RESOURCE_EXIST = 1405010, 1405008, 1405201


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _envelope(code: int, message: str, data: Any = None) -> bytes:
    return json.dumps({"result": code == 0, "code": code, "message": message, "data": data}).encode()


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise Refused(JSON_DECODE, f"json: cannot unmarshal: {what}")


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_meta(meta: Any, where: str) -> None:
    _need(isinstance(meta, dict), f"{where} is not an ObjectMeta")
    _need(isinstance(meta.get("name"), str) and isinstance(meta.get("namespace"), str), f"{where}.name/namespace")
    for key in ("labels", "annotations"):
        value = meta.get(key)
        _need(value is None or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())),
              f"{where}.{key}")


def _check_resource(res: Any, where: str) -> None:
    _need(isinstance(res, dict) and all(_is_num(res.get(k)) for k in ("Cpus", "Mem", "Disk")), f"{where} Resource")


def check_version(version: Any, *, raw_json: bool = True, instances: bool = True) -> None:
    """What the scheduler's Go decoder and ``buildApplication`` require of a ``types.Version``
    (``raw_json``: the driver's application Version carries the v4 document; a deployment's does not;
    ``instances``: a daemonset's count is the scheduler's, one per agent, so any count is taken)."""
    _need(isinstance(version, dict), "Version is not an object")
    _need(isinstance(version.get("ID"), str) and version["ID"], "Version.ID")
    _need(isinstance(version.get("RunAs"), str) and version["RunAs"], "Version.RunAs")
    _need(isinstance(version.get("Instances"), int) and not isinstance(version["Instances"], bool), "Instances")
    _need(version.get("Kind") in ("application", "process", "daemonset"), "Version.Kind")
    _check_meta(version.get("ObjectMeta"), "ObjectMeta")
    _check_meta(version.get("PodObjectMeta"), "PodObjectMeta")
    _need(version["ObjectMeta"]["name"] == version["ID"], "ObjectMeta.name != ID")
    _need(isinstance(version.get("RestartPolicy"), dict)
          and version["RestartPolicy"].get("policy") in ("OnFailure", "Always", "Never"), "RestartPolicy.policy")
    _need(isinstance(version.get("KillPolicy"), dict) and _is_num(version["KillPolicy"].get("gracePeriod")),
          "KillPolicy")
    _need(isinstance(version.get("Labels"), dict), "Labels")
    _need(isinstance(version.get("raw_json"), dict) if raw_json else "raw_json" not in version, "raw_json")
    containers, processes = version.get("Container"), version.get("Process")
    _need(isinstance(containers, list) and isinstance(processes, list), "Container/Process lists")
    for c in containers:
        _need(isinstance(c, dict), "Container")
        docker = c.get("Docker")
        _need(isinstance(docker, dict) and isinstance(docker.get("Image"), str), "Container.Docker.Image")
        _need(isinstance(docker.get("ForcePullImage"), bool) and isinstance(docker.get("Env"), dict), "Docker")
        for mapping in docker.get("PortMappings") or []:
            _need(isinstance(mapping.get("ContainerPort"), int), "PortMapping.ContainerPort")
        _check_resource(c.get("Resources"), "Container.Resources")
        _check_resource(c.get("LimitResoures"), "Container.LimitResoures")
        _need(isinstance(c.get("DataClass"), dict), "Container.DataClass")
        _check_resource(c["DataClass"].get("Resources"), "DataClass.Resources")
        for check in c.get("HealthChecks") or []:
            for key in ("delaySeconds", "intervalSeconds", "timeoutSeconds", "gracePeriodSeconds"):
                _need(isinstance(check.get(key), int) and check[key] > 0, f"HealthCheck.{key} (the driver defaults it)")
        for volume in c.get("Volumes") or []:
            _need(volume.get("Mode") in ("R", "RW"), "Volume.Mode")
    if instances and version["Instances"] <= 0:
        raise Refused(REQUEST_DATA_ERR, "instances error")


def _create_app(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    check_version(body)
    key = (body["RunAs"], body["ID"])
    if key in fake.apps:
        raise Refused(RESOURCE_EXIST, "application already exist")
    fake.apps[key] = body
    return None


def _update_app(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    check_version(body)
    _need((body["RunAs"], body["ID"]) == (params["runAs"], params["appId"]), "path and Version disagree")
    _need("instances" in query, "instances query")
    fake.apps[(body["RunAs"], body["ID"])] = body
    return None


def _scale_app(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    _need(query.get("instances", [""])[0].isdigit(), "instances query")
    _need(query.get("kind", [""])[0] in ("application", "process"), "kind query")
    return None


def _delete_app(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    _need("enforce" in query and query.get("kind", [""])[0] in ("application", "process"), "enforce/kind query")
    fake.apps.pop((params["runAs"], params["appId"]), None)
    return None


def _get_app(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    version = fake.apps.get((params["runAs"], params["appId"]))
    if version is None:
        raise Refused(1405200, "application not found")
    return {"id": version["ID"], "runAs": version["RunAs"], "instances": version["Instances"]}


def _deployment(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    _need(isinstance(body, dict), "DeploymentDef")
    _check_meta(body.get("metadata"), "metadata")
    _need((body["metadata"]["namespace"], body["metadata"]["name"]) == (params["ns"], params["name"]),
          "path and metadata disagree")
    _need(isinstance(body.get("strategy"), dict) and "type" in body["strategy"], "strategy")
    _need(isinstance(body.get("raw_json"), dict), "raw_json")
    if body.get("version") is not None:
        check_version(body["version"], raw_json=False)
    return None


def _plain(kind: str) -> Any:
    def handle(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
        _need(isinstance(body, dict) and body.get("kind") == kind, f"a {kind}")
        _check_meta(body.get("metadata"), "metadata")
        return None
    return handle


def _ok(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    _need(body is None, "no body expected")
    return None


def _queries(*names: str) -> Any:
    """A bodiless call whose handler reads these query parameters (the driver sends each)."""
    def handle(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
        _need(body is None, "no body expected")
        _need(all(name in query for name in names), f"query {names}")
        return None
    return handle


_MESSAGE_PARTS = {1: ("Local", {"To": str, "Right": str, "User": str, "Base64": str}),
                  2: ("Sig", {"Signal": int, "ProcessName": str}),
                  3: ("Env", {"Name": str, "Value": str}),
                  4: ("Remote", {"To": str, "Right": str, "User": str, "From": str})}
_OPTIONAL_PARTS = ("Local", "Sig", "Env", "EnvRemote", "Remote", "Secret", "TaskStatusQuery", "UpdateTaskResources",
                   "CommitTask", "ReloadTask", "RestartTask", "RequestCommandTask", "ResponseCommandTask")


def _message(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    """``types.BcsMessage`` (Go field names) with exactly the part its ``Type`` names."""
    _need(isinstance(body, dict) and isinstance(body.get("Type"), int) and body["Type"] in _MESSAGE_PARTS,
          "BcsMessage.Type")
    _need(all(isinstance(body.get(k), int) for k in ("Id", "CompleteTime", "CreateTime")), "BcsMessage ints")
    _need(isinstance(body.get("TaskGroupId"), str) and isinstance(body.get("Status"), str), "BcsMessage strings")
    key, fields = _MESSAGE_PARTS[body["Type"]]
    part = body.get(key)
    _need(isinstance(part, dict) and all(isinstance(part.get(f), t) for f, t in fields.items()), f"BcsMessage.{key}")
    _need([k for k in _OPTIONAL_PARTS if k in body] == [key], "one message part")
    return None


def _daemonset(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    """``types.BcsDaemonsetDef``: ObjectMeta inline, ``version`` a daemonset Version."""
    _check_meta(body, "BcsDaemonsetDef")
    check_version(body.get("version"), raw_json=False, instances=False)
    _need(body["version"]["Kind"] == "daemonset" and body["version"]["ID"] == body["name"], "daemonset version")
    _need(body["version"]["RunAs"] == body["namespace"], "RunAs is the namespace")
    return None


def _json_list(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    if not (isinstance(body, list) and all(isinstance(item, dict) for item in body)):
        raise Refused(REQUEST_DATA_ERR, "json: cannot unmarshal into []*BcsClusterAgentSetting")
    return None


def _json_object(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        raise Refused(JSON_DECODE, "json: cannot unmarshal: an object expected")
    return None


def _command(kind: str) -> Any:
    def handle(fake: FakeScheduler, params: dict[str, str], query: Any, body: Any) -> Any:
        """``sendApplicationCommand``: the target must be the path's (``Application``/``Deployment``)."""
        _need(isinstance(body, dict), "BcsCommand")
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise Refused(REQUEST_DATA_ERR, "command has no spec")
        ref = spec.get("commandTargetRef") or {}
        if (ref.get("kind"), ref.get("namespace"), ref.get("name")) != (kind, params["ns"], params["name"]):
            raise Refused(REQUEST_DATA_ERR, "request data error")
        return f"{kind}-{params['ns']}-{params['name']}-1"
    return handle


_V1 = [
    ("POST", "/v1/apps", _create_app),
    ("POST", "/v1/apps/{runAs}/{appId}/update", _update_app),
    ("POST", "/v1/apps/{runAs}/{appId}/scale", _scale_app),
    ("DELETE", "/v1/apps/{runAs}/{appId}", _delete_app),
    ("GET", "/v1/apps/{runAs}/{appId}", _get_app),
    ("GET", "/v1/{runAs}/apps", _ok),
    ("POST", "/v1/deployment/{ns}/{name}", _deployment),
    ("PUT", "/v1/deployment/{ns}/{name}", _deployment),
    ("DELETE", "/v1/deployment/{ns}/{name}", _ok),
    ("PUT", "/v1/deployment/{ns}/{name}/scale/{n}", _ok),
    ("POST", "/v1/deployment/{ns}/{name}/cancelupdate", _ok),
    ("POST", "/v1/deployment/{ns}/{name}/pauseupdate", _ok),
    ("POST", "/v1/deployment/{ns}/{name}/resumeupdate", _ok),
    ("GET", "/v1/apps/{runAs}/{appId}/taskgroups", _ok),
    ("GET", "/v1/apps/{runAs}/{appId}/versions", _ok),
    ("POST", "/v1/configmap", _plain("configmap")), ("PUT", "/v1/configmap", _plain("configmap")),
    ("POST", "/v1/secret", _plain("secret")), ("PUT", "/v1/secret", _plain("secret")),
    ("POST", "/v1/service", _plain("service")), ("PUT", "/v1/service", _plain("service")),
    ("DELETE", "/v1/configmap/{ns}/{name}", _ok), ("DELETE", "/v1/secret/{ns}/{name}", _ok),
    ("DELETE", "/v1/service/{ns}/{name}", _ok),
    ("GET", "/v1/cluster/resources", _ok),
    # /v1/apps/{runAs}/{appId}/tasks and /v1/agentsettings/delete are commented out in the real
    # scheduler's routes.go: go-restful answers 404 there, so does this fake.
    ("POST", "/v1/apps/{runAs}/{appId}/message", _message),
    ("POST", "/v1/apps/{runAs}/{appId}/message/{taskgroupId}", _message),
    ("GET", "/v1/apps/{runAs}/{appId}/versions/{versionId}", _ok),
    ("PUT", "/v1/taskgroup/{taskgroupId}/rescheduler", _queries("hostRetainTime")),
    ("POST", "/v1/taskgroup/{taskgroupId}/restart", _ok),
    ("POST", "/v1/taskgroup/{taskgroupId}/reload", _ok),
    ("POST", "/v1/daemonsets", _daemonset),
    ("DELETE", "/v1/daemonsets/{ns}/{name}", _queries("enforce")),
    ("GET", "/v1/transactions/{ns}", _queries("objKind", "objName")),
    ("DELETE", "/v1/transactions/{ns}/{name}", _ok),
    ("GET", "/v1/agentsettings", _queries("ips")),
    ("POST", "/v1/agentsettings", _json_list),
    ("POST", "/v1/agentsettings/enable", _queries("ips")),
    ("POST", "/v1/agentsettings/disable", _queries("ips")),
    ("PUT", "/v1/agentsettings/taint", _json_list),
    ("PUT", "/v1/agentsettings/extendedresource", _json_object),
    ("POST", "/v1/crr/register", _json_object),
    ("POST", "/v1/crd/namespaces/{ns}/{kind}", _json_object),
    ("PUT", "/v1/crd/namespaces/{ns}/{kind}", _json_object),
    ("DELETE", "/v1/crd/namespaces/{ns}/{kind}/{name}", _ok),
    ("GET", "/v1/crd/namespaces/{ns}/{kind}/{name}", _ok),
    ("GET", "/v1/crd/namespaces/{ns}/{kind}", _ok),
    ("GET", "/v1/crd/{kind}", _ok),
    ("POST", "/v1/image/commit/{taskgroup}", _queries("image", "url")),
    ("POST", "/v1/command/application/{ns}/{name}", _command("Application")),
    ("GET", "/v1/command/application/{ns}/{name}", _queries("id")),
    ("DELETE", "/v1/command/application/{ns}/{name}", _queries("id")),
    ("POST", "/v1/command/deployment/{ns}/{name}", _command("Deployment")),
    ("GET", "/v1/command/deployment/{ns}/{name}", _queries("id")),
    ("DELETE", "/v1/command/deployment/{ns}/{name}", _queries("id")),
    ("GET", "/v1/definition/application/{ns}/{name}", _ok),
    ("GET", "/v1/definition/deployment/{ns}/{name}", _ok),
    ("GET", "/v1/cluster/endpoints", _ok),
    ("GET", "/v1/cluster/current/offers", _ok),
]
_COMPILED = [(m, re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", t)), h) for m, t, h in _V1]


def _match(method: str, path: str) -> tuple[Any, dict[str, str]] | None:
    for route_method, pattern, handler in _COMPILED:
        match = pattern.fullmatch(path)
        if match and route_method == method:
            return handler, match.groupdict()
    return None
