"""bcs v4 resources → the bcs-scheduler's internal types, as the source's mesos-driver builds them.

The source (``bcs-mesos-driver/mesosdriver/backend/v4http/create.go`` and
``deployment.go``) decodes a ``ReplicaController`` or ``BcsDeployment``
(``bcs-common/common/types``) and builds a scheduler ``Version`` /
``DeploymentDef`` (``bcs-common/pkg/scheduler/schetypes``). ``Version`` and its
parts have no JSON tags, so on the wire their keys are the Go field names
(``ID``, ``RunAs``, ``Container``, ``LimitResoures`` — sic); ``DeploymentDef``
is tagged (``metadata``, ``version``, ``strategy``, ``raw_json``).

The defaults are the source's: restart policy ``OnFailure``; ``RunAs`` from the
namespace (``defaultGroup`` when empty, applications only); requests copied from
limits when only limits give a CPU; health checks ``delaySeconds`` 10,
``intervalSeconds`` 60, ``timeoutSeconds`` 20, ``gracePeriodSeconds`` 300 when
absent or not positive; ``ForcePullImage`` only for ``imagePullPolicy: Always``;
volume mode ``R`` when read-only, else ``RW``.

Documents reach these functions as :func:`.routes.canonical` made them — decoded as
Go decodes them, keys in the tags' spelling (``networkType`` is read as the
``networktype`` it is to Go, and rewritten so) — so they read exact keys. One
deliberate difference: ``raw_json`` carries that document as admitted, not Go's
re-encoding of it (which adds every absent field as its zero value and drops the
keys Go ignores); the scheduler stores it and hands it back on definition reads.

Errors are :class:`ConversionError` (400) carrying the source's message and
its bcs error code (``bcs_code``) for the edge that renders bcs envelopes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..core.errors import BadRequest

APPLICATION, PROCESS, DEPLOYMENT, DAEMONSET = "application", "process", "deployment", "daemonset"
CONFIGMAP, SECRET, SERVICE = "configmap", "secret", "service"

# bcs-common/common/errorCode.go: AdditionErrorCode = 1405000.
BCS_REQUEST_DATA_ERR = 1405008  # BcsErrCommRequestDataErr (kind check)
BCS_JSON_DECODE = 1405010  # BcsErrCommJsonDecode
BCS_DRIVER_PARAMETER_ERR = 1405231  # BcsErrMesosDriverParameterErr
BCS_SEND_MSG_UNKNOWN_TYPE = 1405233  # BcsErrMesosDriverSendMsgUnknowType
_PARAMETER_ERR = "there is some error in the parameters"  # BcsErrMesosDriverParameterErrStr

_RESTART_POLICIES = ("OnFailure", "Always", "Never")
_HEALTH_DEFAULTS = (("delaySeconds", 10), ("intervalSeconds", 60), ("timeoutSeconds", 20),
                    ("gracePeriodSeconds", 300))
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, which omitempty does not omit
_REQUEST_IP = "io.tencent.bcs.netsvc.requestip."
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class ConversionError(BadRequest):
    """A v4 document the source's driver refuses (400, with the source's bcs code)."""

    code_name = "BAD_PARAMETER"

    def __init__(self, message: str, *, bcs_code: int = BCS_DRIVER_PARAMETER_ERR, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.bcs_code = bcs_code


def _get(doc: Mapping[str, Any], key: str) -> Any:
    return doc.get(key)


def _decode_error(what: str) -> ConversionError:
    return ConversionError(f"json decode failed! {what}", bcs_code=BCS_JSON_DECODE, code_name="JSON_DECODE")


def _obj(doc: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = _get(doc, key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _decode_error(f"{where}{key} must be an object")
    return value


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = _get(doc, key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _decode_error(f"{where}{key} must be a list")
    return value


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = _get(doc, key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _decode_error(f"{where}{key} must be a string")
    return value


def _int(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = _get(doc, key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise _decode_error(f"{where}{key} must be an integer")
    return int(value)


def _str_map(doc: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = _obj(doc, key, where)
    if not all(isinstance(v, str) for v in value.values()):
        raise _decode_error(f"{where}{key} values must be strings")
    return dict(value)


def check_kind(doc: Any, kind: str) -> None:
    """``util.CheckKind``: the document's ``kind`` must be exactly ``kind``."""
    if not isinstance(doc, dict):
        raise _decode_error("the body must be a JSON object")
    if _get(doc, "kind") != kind:
        raise ConversionError(f"Kind {_get(doc, 'kind') or ''} is invalid", bcs_code=BCS_REQUEST_DATA_ERR,
                              code_name="WRONG_KIND")


def object_meta(meta: Mapping[str, Any], where: str = "metadata.") -> dict[str, Any]:
    """``commtypes.ObjectMeta`` as Go encodes it (labels/annotations omitted when empty)."""
    out: dict[str, Any] = {
        "name": _str(meta, "name", where),
        "namespace": _str(meta, "namespace", where),
        "creationTimestamp": _str(meta, "creationTimestamp", where) or _ZERO_TIME,
    }
    for key in ("labels", "annotations"):
        value = _str_map(meta, key, where)
        if value:
            out[key] = value
    if _str(meta, "clusterName", where):
        out["clusterName"] = _str(meta, "clusterName", where)
    return out


def _meta_is_valid(meta: Mapping[str, Any]) -> None:
    if "." in meta["name"]:
        raise ConversionError("Name can't contains contains '.'", code_name="BAD_NAME")


def _go_float(value: str) -> float:
    """``strconv.ParseFloat(s, 64)`` with the error ignored, as the source does: 0 when unparsable."""
    if not _FLOAT.fullmatch(value.strip()) or value != value.strip():
        return 0.0
    number = float(value)
    return number if math.isfinite(number) else 0.0


def _resource(res: Mapping[str, str]) -> dict[str, float]:
    return {"Cpus": _go_float(res.get("cpu", "")), "Mem": _go_float(res.get("memory", "")),
            "Disk": _go_float(res.get("storage", ""))}


def _resource_list(doc: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = _obj(doc, key, where)
    return {k: _str(value, k, f"{where}{key}.") for k in ("cpu", "memory", "storage")}


def _health_checks(checks: list[Any], where: str) -> list[dict[str, Any]]:
    out = []
    for check in checks:
        if not isinstance(check, dict):
            raise _decode_error(f"{where}healthChecks items must be objects")
        check = dict(check)
        for key, default in _HEALTH_DEFAULTS:
            if _int(check, key, where) <= 0:
                check[key] = default
        out.append(check)
    return out


def _env(items: list[Any], requests: dict[str, float], limits: dict[str, float], where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    computed = {"requests.cpu": requests["Cpus"] * 1000, "requests.memory": requests["Mem"],
                "limits.cpu": limits["Cpus"] * 1000, "limits.memory": limits["Mem"]}
    for item in items:
        if not isinstance(item, dict):
            raise _decode_error(f"{where}env items must be objects")
        name = _str(item, "name", where)
        field = _obj(_obj(item, "valueFrom", where), "resourceFieldRef", where)
        resource = _str(field, "resource", where)
        if resource:
            if resource in computed:
                env[name] = f"{computed[resource]:f}"  # Go's %f
            # else: the source logs the unknown resource and sets nothing
        else:
            env[name] = _str(item, "value", where)
    return env


def _container(c: Any, spec: Mapping[str, Any], index: int) -> dict[str, Any]:
    where = f"spec.template.spec.containers[{index}]."
    if not isinstance(c, dict):
        raise _decode_error(f"{where[:-1]} must be an object")
    resources = _obj(c, "resources", where)
    requests = _resource_list(resources, "requests", f"{where}resources.")
    limits = _resource_list(resources, "limits", f"{where}resources.")
    if requests["cpu"] == "" and limits["cpu"] != "":
        requests = dict(limits)
    request_res, limit_res = _resource(requests), _resource(limits)
    net_limit = _get(spec, "netLimit")
    ports = _port_mappings(c, where)
    parameters = _parameters(c, where)
    volumes = _volumes(c, where)
    docker = _docker(c, spec, where, ports, parameters, request_res, limit_res)
    return {
        "Type": _str(c, "type", where),
        "Docker": docker,
        "Volumes": volumes,
        "Resources": request_res,
        "LimitResoures": limit_res,  # sic: the scheduler's field name
        "DataClass": {
            "Resources": request_res,
            "LimitResources": limit_res,
            "ExtendedResources": _get(resources, "extendedResources"),
            "Msgs": [],
            "NetLimit": net_limit,
            "ProcInfo": None,
        },
        "ConfigMaps": _get(c, "configmaps"),
        "Secrets": _get(c, "secrets"),
        "HealthChecks": _health_checks(_list(c, "healthChecks", where), where) if _get(c, "healthChecks") else None,
        "NetLimit": net_limit,
    }


def _port_mappings(c: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    ports = []
    for port in _list(c, "ports", where):
        if not isinstance(port, dict):
            raise _decode_error(f"{where}ports items must be objects")
        ports.append({"ContainerPort": _int(port, "containerPort", where), "HostPort": _int(port, "hostPort", where),
                      "Name": _str(port, "name", where), "Protocol": _str(port, "protocol", where)})
    return ports


def _parameters(c: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    parameters = []
    for param in _list(c, "parameters", where):
        if not isinstance(param, dict):
            raise _decode_error(f"{where}parameters items must be objects")
        parameters.append({"Key": _str(param, "key", where), "Value": _str(param, "value", where)})
    return parameters


def _volumes(c: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    volumes = []
    for unit in _list(c, "volumes", where):
        if not isinstance(unit, dict):
            raise _decode_error(f"{where}volumes items must be objects")
        volume = _obj(unit, "volume", where)
        volumes.append({"ContainerPath": _str(volume, "mountPath", where), "HostPath": _str(volume, "hostPath", where),
                        "Mode": "R" if _get(volume, "readOnly") is True else "RW"})
    return volumes


def _docker(c: Mapping[str, Any], spec: Mapping[str, Any], where: str, ports: list[dict[str, Any]],
            parameters: list[dict[str, Any]], request_res: dict[str, float], limit_res: dict[str, float],
            ) -> dict[str, Any]:
    """The container's ``Docker`` section (the scheduler's ``DockerInfo``)."""
    args = _list(c, "args", where)
    return {
        "Hostname": _str(c, "hostname", where),
        "ForcePullImage": _str(c, "imagePullPolicy", where) == "Always",
        "Image": _str(c, "image", where),
        "ImagePullUser": _str(c, "imagePullUser", where),
        "ImagePullPasswd": _str(c, "imagePullPasswd", where),
        "Network": _str(spec, "networkMode", "spec.template.spec."),
        "NetworkType": _str(spec, "networktype", "spec.template.spec."),
        "Command": _str(c, "command", where),
        "Arguments": args or None,
        "Parameters": parameters,
        "PortMappings": ports,
        "Env": _env(_list(c, "env", where), request_res, limit_res, where),
        "Privileged": _get(c, "privileged") is True,
    }


def _restart_policy(doc: Mapping[str, Any]) -> dict[str, Any]:
    policy = dict(_obj(doc, "restartPolicy", ""))
    policy["policy"] = _str(policy, "policy", "restartPolicy.") or "OnFailure"
    if policy["policy"] not in _RESTART_POLICIES:
        raise ConversionError(f"{_PARAMETER_ERR}restart policy error", code_name="BAD_RESTART_POLICY")
    return policy


def _new_version(doc: Mapping[str, Any], meta: dict[str, Any], *, kind: str, run_as: str,
                 instances: int) -> dict[str, Any]:
    kill = _obj(doc, "killPolicy", "")
    labels = dict(meta.get("labels", {}))
    return {
        "ID": meta["name"],
        "Name": "",
        "ObjectMeta": meta,
        "PodObjectMeta": {},
        "Instances": instances,
        "RunAs": run_as,
        "Container": [],
        "Process": [],
        "Labels": labels,
        "KillPolicy": {"gracePeriod": _int(kill, "gracePeriod", "killPolicy.")},
        "RestartPolicy": _restart_policy(doc),
        "Constraints": _get(doc, "constraint"),
        "Uris": [],
        "Ip": [],
        "Mode": "",
        "Kind": kind,
    }


def _with_pod_spec(version: dict[str, Any], template: Any) -> dict[str, Any]:
    """``setVersionWithPodSpec``: containers (or processes), pod metadata, template labels."""
    if template is None:
        raise ConversionError(f"{_PARAMETER_ERR} no template", code_name="NO_TEMPLATE")
    if not isinstance(template, dict):
        raise _decode_error("spec.template must be an object")
    spec = _obj(template, "spec", "spec.template.")
    containers = _list(spec, "containers", "spec.template.spec.")
    processes = _list(spec, "processes", "spec.template.spec.")
    if not containers and not processes:
        raise ConversionError(f"{_PARAMETER_ERR}no containers and processes", code_name="NO_CONTAINERS")
    if containers and processes:
        raise ConversionError(f"{_PARAMETER_ERR}containers and processes cannot coexist",
                              code_name="CONTAINERS_AND_PROCESSES")
    if not version["Kind"]:
        version["Kind"] = APPLICATION if containers else PROCESS
    pod_meta = object_meta(_obj(template, "metadata", "spec.template."), "spec.template.metadata.")
    pod_meta["namespace"] = version["ObjectMeta"]["namespace"]
    pod_meta["name"] = version["ObjectMeta"]["name"]
    template_labels = pod_meta.get("labels")
    if template_labels is None:
        if "labels" in version["ObjectMeta"]:
            pod_meta["labels"] = dict(version["ObjectMeta"]["labels"])
    else:
        for key, value in version["ObjectMeta"].get("labels", {}).items():
            template_labels.setdefault(key, value)
    version["PodObjectMeta"] = pod_meta
    version["Labels"].update(_str_map(_obj(template, "metadata", "spec.template."), "labels",
                                      "spec.template.metadata."))
    version["Process"] = processes
    version["Container"] = [_container(c, spec, i) for i, c in enumerate(containers)]
    return version


def version_from_application(doc: Any) -> dict[str, Any]:
    """``newVersionWithParam``: a v4 ``application`` (or ``process``) → a scheduler ``Version``."""
    if not isinstance(doc, dict):
        raise _decode_error("the body must be a JSON object")
    meta = object_meta(_obj(doc, "metadata", ""))
    _meta_is_valid(meta)
    spec = _obj(doc, "spec", "")
    version = _new_version(doc, meta, kind=_str(doc, "kind", ""), run_as=meta["namespace"] or "defaultGroup",
                           instances=_int(spec, "instance", "spec."))
    version = _with_pod_spec(version, _get(spec, "template"))
    # The source strips spaces from the requested-IP lists of the netservice.
    for mapping in (version["Labels"], version["ObjectMeta"].get("annotations", {})):
        for key, value in mapping.items():
            if _REQUEST_IP in key:
                mapping[key] = value.replace(" ", "")
    version["raw_json"] = doc
    return version


def deployment_def(doc: Any) -> dict[str, Any]:
    """``newDeploymentDefWithParam``: a v4 ``deployment`` → a scheduler ``DeploymentDef``."""
    if not isinstance(doc, dict):
        raise _decode_error("the body must be a JSON object")
    meta = object_meta(_obj(doc, "metadata", ""))
    _meta_is_valid(meta)
    spec = _obj(doc, "spec", "")
    strategy = _obj(spec, "strategy", "spec.")
    out: dict[str, Any] = {
        "metadata": meta,
        "version": None,
        "strategy": {"type": _str(strategy, "type", "spec.strategy."),
                     "rollingupdate": _get(strategy, "rollingupdate")},
        "raw_json": doc,
    }
    selector = _str_map(spec, "selector", "spec.")
    if selector:
        out["selector"] = selector
    if _get(spec, "template") is not None:
        version = _new_version(doc, dict(meta), kind="", run_as=meta["namespace"],
                               instances=_int(spec, "instance", "spec."))
        out["version"] = _with_pod_spec(version, _get(spec, "template"))
    return out


def daemonset_def(doc: Any) -> dict[str, Any]:
    """``newDaemonsetDefWithParam``: a v4 ``daemonset`` → a scheduler ``BcsDaemonsetDef``.

    Unlike an application: ``RunAs`` is the namespace as given (no ``defaultGroup``),
    ``Constraints`` stay null (``BcsDaemonset`` has no ``constraint``), and the Version
    carries no ``raw_json``. The definition is the ``ObjectMeta`` inline plus ``version``.
    """
    if not isinstance(doc, dict):
        raise _decode_error("the body must be a JSON object")
    meta = object_meta(_obj(doc, "metadata", ""))
    _meta_is_valid(meta)
    spec = _obj(doc, "spec", "")
    version = _new_version(doc, dict(meta), kind=DAEMONSET, run_as=meta["namespace"],
                           instances=_int(spec, "instance", "spec."))
    version["Constraints"] = None
    version = _with_pod_spec(version, _get(spec, "template"))
    return {**meta, "version": version}


# send.go: the v4 message type → (BcsMessage.Type, its part's key, the part built from msgdata).
_MSG_LOCAL, _MSG_SIGNAL, _MSG_ENV, _MSG_REMOTE = 1, 2, 3, 4


def _msg_str(data: Mapping[str, Any], key: str) -> str:
    # msgdata is read with simplejson (exact keys); a value of another type is refused
    # where the source would send "" in its place.
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _decode_error(f"msgdata.{key} must be a string")
    return value


def bcs_message(doc: Any) -> dict[str, Any]:
    """``SendMessageApplication``: a v4 ``SendMsgOpeParam`` (``msgtype``, ``msgdata``) →
    a scheduler ``BcsMessage`` as Go encodes it (no JSON tags: Go field names; nil
    pointers as ``null``; the parts of other message types omitted)."""
    if not isinstance(doc, dict):
        raise _decode_error("the body must be a JSON object")
    msg_type = _str(doc, "msgtype", "")
    data = _get(doc, "msgdata")
    if not isinstance(data, dict):
        data = {}  # simplejson finds no keys in a non-object: every field reads as empty
    part: dict[str, Any]
    if msg_type == "local":
        code, key = _MSG_LOCAL, "Local"
        part = {"To": _msg_str(data, "to"), "Right": _msg_str(data, "right"), "User": _msg_str(data, "user"),
                "Base64": _msg_str(data, "ctx")}
    elif msg_type == "remote":
        code, key = _MSG_REMOTE, "Remote"
        part = {"To": _msg_str(data, "to"), "Right": _msg_str(data, "right"), "User": _msg_str(data, "user"),
                "From": _msg_str(data, "remote"), "Type": None, "RemoteUser": None, "RemotePasswd": None}
    elif msg_type == "signal":
        signal = data.get("signal")
        if isinstance(signal, bool) or not isinstance(signal, int) or not 0 <= signal < 2**32:
            # Go: simplejson Int() fails on a missing or non-integer value; uint32() would wrap the rest
            raise _decode_error("msgdata.signal must be an integer from 0 to 4294967295")
        code, key = _MSG_SIGNAL, "Sig"
        part = {"Signal": signal, "ProcessName": _msg_str(data, "processname")}
    elif msg_type == "env-key":
        code, key = _MSG_ENV, "Env"
        part = {"Name": _msg_str(data, "env-key"), "Value": _msg_str(data, "env-value")}
    else:
        raise ConversionError("unkown the message type", bcs_code=BCS_SEND_MSG_UNKNOWN_TYPE,
                              code_name="UNKNOWN_MESSAGE_TYPE")
    return {"Id": 0, "Type": code, "TaskGroupId": "", "TaskID": None, key: part, "Status": "", "Message": "",
            "CompleteTime": 0, "CreateTime": 0}
