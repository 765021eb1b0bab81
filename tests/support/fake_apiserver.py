"""A fake Kubernetes apiserver that real kubectl and the official Python client accept.

The real kube-apiserver cannot be installed here, so every tunnel test talks to
this one instead. It serves, over TLS with a generated CA, on 127.0.0.1:

* discovery (``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/{group}/{version}``) in the
  legacy format: kubectl 1.27+ first asks for the aggregated ``APIGroupDiscoveryList`` and falls
  back when the answer carries a plain ``application/json`` content type;
* the smallest OpenAPI documents that make ``kubectl apply`` validate on the server side
  (``fieldValidation=Strict``) instead of refusing to run: ``/openapi/v3`` (kubectl 1.28+) and
  ``/openapi/v2`` as gnostic protobuf (kubectl 1.27); they list each kind's PATCH operation with
  its parameters and no schemas, so ``apply`` builds strategic merge patches from kubectl's
  compiled-in types, as it does for every built-in kind anyway;
* an in-memory object store (pods, namespaces, configmaps, services, endpoints, deployments and
  RBAC roles/bindings) with GET/LIST (label and field selectors), POST, PUT (resourceVersion
  conflicts), PATCH (merge, JSON, strategic merge, server-side apply basics) and DELETE; errors
  are real ``Status`` objects;
* ``meta.k8s.io/v1`` ``Table`` answers when kubectl asks for them (``kubectl get``);
* ``watch=true`` streams (chunked, one JSON event per line, flushed as they happen) honouring
  ``resourceVersion`` and ``timeoutSeconds``; ``.open_watches`` counts open ones;
* ``pods/{name}/log`` (``follow=true`` streams a line every ``log_interval`` seconds);
* test endpoints outside the Kubernetes API, without authentication (an upstream proxy that
  never forwards credentials can reach them): ``POST /__digest`` (streams the body, sized or
  chunked, answers ``{"bytes", "sha256"}``), ``GET /__bytes?n=N``, ``GET /__slow?seconds=S``
  (``slow_now``/``slow_peak``: how many at once, now and at most);
* discovery documents carry an ETag and answer a matching ``If-None-Match`` with ``304``.

Every request is recorded (``.requests``). Authentication is ``Authorization: Bearer <token>``;
an ``authorize(callable)`` hook sees each API request with the impersonated user and may deny it
with the 403 ``Status`` the real apiserver sends.

The handler is ``http.server`` based so it owns the client socket: ``on_upgrade(callable)`` lets
a test take over ``pods/{name}/exec|attach|portforward`` requests and answer ``101`` itself.

Example::

    with FakeAPIServer(token="sa-token") as api:
        api.store.create("pods", {"metadata": {"name": "web", "namespace": "default"}})
        kubeconfig = write_kubeconfig(tmp / "kc", server=api.url, token="sa-token",
                                      ca_pem=api.ca_pem)
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import copy
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import queue
import re
import select
import socket
import ssl
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch
import trustme
import yaml
from werkzeug.datastructures import Headers

JSON = dict[str, Any]

#: Bodies of API objects are bounded; ``/__digest`` streams instead.
MAX_OBJECT_BODY = 8 * 1024 * 1024
#: A watch without ``timeoutSeconds`` still ends (the real apiserver picks 30-60 minutes).
DEFAULT_WATCH_SECONDS = 1800.0
#: How often blocked streams look at the stop flag and the client socket.
POLL_SECONDS = 0.1


# --------------------------------------------------------------------------- resource types

@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives in the API and how discovery describes it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (name, kind, verbs)
    categories: tuple[str, ...] = ()

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

RESOURCE_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "Pod", "pods", True, ("po",), (
        ("pods/log", "Pod", ("get",)),
        ("pods/exec", "PodExecOptions", ("create", "get")),
        ("pods/attach", "PodAttachOptions", ("create", "get")),
        ("pods/portforward", "PodPortForwardOptions", ("create", "get")),
        ("pods/status", "Pod", ("get", "patch", "update")),
    ), ("all",)),
    ResourceType("", "v1", "Namespace", "namespaces", False, ("ns",)),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, ("cm",)),
    ResourceType("", "v1", "Service", "services", True, ("svc",), categories=("all",)),
    ResourceType("", "v1", "Endpoints", "endpoints", True, ("ep",)),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",)),
    ResourceType("", "v1", "Secret", "secrets", True),
    ResourceType("apps", "v1", "Deployment", "deployments", True, ("deploy",),
                 (("deployments/status", "Deployment", ("get", "patch", "update")),),
                 ("all",)),
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectAccessReview",
                 "selfsubjectaccessreviews", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding",
                 "clusterrolebindings", False),
)
_BY_PLURAL = {(rt.group, rt.plural): rt for rt in RESOURCE_TYPES}
_BY_KIND = {(rt.group_version, rt.kind): rt for rt in RESOURCE_TYPES}
_GROUPS: dict[str, list[ResourceType]] = {}
for _type in RESOURCE_TYPES:
    _GROUPS.setdefault(_type.group_version, []).append(_type)


def resource_type(resource: str, group: str = "") -> ResourceType:
    """The served type for a plural name (``"pods"``) or ``"rolebindings"`` etc."""
    if (group, resource) in _BY_PLURAL:
        return _BY_PLURAL[(group, resource)]
    for rt in RESOURCE_TYPES:
        if rt.plural == resource:
            return rt
    raise KeyError(resource)


# --------------------------------------------------------------------------- errors

class ApiError(Exception):
    """An error the fake answers with a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(rt)} "{name}" not found',
                    {"name": name, "group": rt.group, "kind": rt.plural})


def _qualified(rt: ResourceType) -> str:
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


# --------------------------------------------------------------------------- selectors

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_.\-/]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[^,]*?)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def selector_matches(selector: str | None, values: Callable[[str], str | None]) -> bool:
    """Evaluate a label (or field) selector against ``values(key)``; ``None`` = key absent."""
    if not selector:
        return True
    for requirement in _split_selector(selector):
        match = _REQUIREMENT.match(requirement)
        if match is None:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {requirement!r}")
        actual = values(match["key"])
        if match["op"]:
            equal = actual == match["value"].strip()
            if (match["op"] == "!=") == equal:
                return False
        elif match["setop"]:
            options = {value.strip() for value in match["values"].split(",")}
            inside = actual is not None and actual in options
            if (match["setop"] == "in") != inside:
                return False
        elif (actual is None) != bool(match["neg"]):
            return False
    return True


def _field_value(obj: JSON, path: str) -> str | None:
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return None if isinstance(current, (dict, list)) else str(current)


def object_matches(obj: JSON, label_selector: str | None, field_selector: str | None) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return selector_matches(label_selector, labels.get) and selector_matches(
        field_selector, lambda path: _field_value(obj, path)
    )


# --------------------------------------------------------------------------- strategic merge

#: Merge keys of the built-in list fields kubectl's strategic patches touch.
_MERGE_KEYS = ("name", "containerPort", "mountPath", "devicePath", "ip", "topologyKey", "type")


def strategic_merge(original: Any, patch: Any) -> Any:
    """Apply a strategic merge patch well enough for ``kubectl apply`` on built-in kinds.

    Lists of objects merge by their merge key (``name``, ``containerPort``, ``mountPath`` …),
    ``$patch: replace|delete``, ``$setElementOrder/…``, ``$deleteFromPrimitiveList/…`` and
    ``$retainKeys`` are honoured; everything else behaves as JSON merge patch (RFC 7386).
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [item for item in result[name] if item not in value]
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value)
        else:
            result[key] = strategic_merge(result.get(key), value)
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            result[name] = _order_list(result[name], order)
    if isinstance(patch.get("$retainKeys"), list):
        keep = set(patch["$retainKeys"])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_key(items: list[Any]) -> str | None:
    dicts = [item for item in items if isinstance(item, dict)]
    if not dicts or len(dicts) != len(items):
        return None
    for key in _MERGE_KEYS:
        if all(key in item for item in dicts if item.get("$patch") != "replace"):
            return key
    return None


def _merge_list(original: list[Any], patch: list[Any]) -> list[Any]:
    key = _merge_key(patch)
    if key is None or not all(isinstance(item, dict) for item in original):
        return [item for item in copy.deepcopy(patch) if item != {"$patch": "replace"}]
    result = copy.deepcopy(original)
    for item in patch:
        index = next((i for i, old in enumerate(result) if old.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge({}, item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def _order_list(items: list[Any], order: list[Any]) -> list[Any]:
    def position(item: Any) -> int:
        for i, wanted in enumerate(order):
            if isinstance(wanted, dict) and isinstance(item, dict):
                if all(item.get(k) == v for k, v in wanted.items()):
                    return i
            elif wanted == item:
                return i
        return len(order)

    return sorted(items, key=position)


# --------------------------------------------------------------------------- store and watches

@dataclass(frozen=True)
class WatchEvent:
    type: str
    resource: ResourceType
    object: JSON
    resource_version: int


class _Watcher:
    def __init__(self, rt: ResourceType, namespace: str | None, labels: str | None,
                 fields: str | None) -> None:
        self.rt, self.namespace, self.labels, self.fields = rt, namespace, labels, fields
        self.events: queue.Queue[WatchEvent] = queue.Queue()

    def wants(self, event: WatchEvent) -> bool:
        if event.resource != self.rt:
            return False
        namespace = event.object.get("metadata", {}).get("namespace")
        if self.namespace is not None and namespace != self.namespace:
            return False
        return object_matches(event.object, self.labels, self.fields)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ObjectStore:
    """Thread-safe in-memory objects keyed by (resource, namespace, name), with watch fan-out.

    Every write bumps one global ``resourceVersion`` (as etcd's revision does), is appended to a
    bounded history (so a watch from an older ``resourceVersion`` replays what it missed, and one
    from before the history gets ``410 Expired``) and is pushed to the matching open watches.
    Methods take and return plain dicts (deep copies); errors are :class:`ApiError`.
    """

    def __init__(self, history: int = 10_000) -> None:
        self._lock = threading.RLock()
        self._objects: dict[tuple[ResourceType, str, str], JSON] = {}
        self._rv = 1
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._watchers: set[_Watcher] = set()

    # -- reads

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, resource: str | ResourceType, namespace: str | None, name: str) -> JSON:
        rt = _rt(resource)
        with self._lock:
            obj = self._objects.get((rt, self._ns(rt, namespace), name))
            if obj is None:
                raise _not_found(rt, name)
            return copy.deepcopy(obj)

    def list(self, resource: str | ResourceType, namespace: str | None = None, *,
             label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[JSON], int]:
        """Matching objects sorted by namespace and name, and the store's resourceVersion."""
        rt = _rt(resource)
        with self._lock:
            items = [
                copy.deepcopy(obj) for (kind, ns, _), obj in sorted(
                    self._objects.items(), key=lambda item: (item[0][1], item[0][2]))
                if kind == rt and (namespace is None or not rt.namespaced or ns == namespace)
                and object_matches(obj, label_selector, field_selector)
            ]
            return items, self._rv

    # -- writes

    def create(self, resource: str | ResourceType, obj: JSON, namespace: str | None = None, *,
               dry_run: bool = False) -> JSON:
        rt = _rt(resource)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value",
                           {"kind": rt.kind, "causes": [{"reason": "FieldValueRequired",
                                                          "field": "metadata.name"}]})
        ns = self._ns(rt, namespace if namespace is not None else meta.get("namespace"))
        if rt.namespaced and meta.get("namespace") not in (None, "", ns):
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                           "match the namespace sent on the request")
        with self._lock:
            if rt.namespaced and (_rt("namespaces"), "", ns) not in self._objects:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found',
                               {"name": ns, "kind": "namespaces"})
            if (rt, ns, name) in self._objects:
                raise ApiError(409, "AlreadyExists", f'{_qualified(rt)} "{name}" already exists',
                               {"name": name, "group": rt.group, "kind": rt.plural})
            obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
            meta.pop("resourceVersion", None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            if rt.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            _defaults(rt, obj)
            if dry_run:
                meta["resourceVersion"] = str(self._rv)
                return obj
            return self._write("ADDED", rt, ns, obj)

    def replace(self, resource: str | ResourceType, obj: JSON, namespace: str | None = None, *,
                dry_run: bool = False) -> JSON:
        """PUT semantics: a stale ``metadata.resourceVersion`` is a 409 Conflict."""
        rt = _rt(resource)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name", "")
        ns = self._ns(rt, namespace if namespace is not None else meta.get("namespace"))
        with self._lock:
            current = self._objects.get((rt, ns, name))
            if current is None:
                raise _not_found(rt, name)
            wanted = meta.get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {_qualified(rt)} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": rt.group, "kind": rt.plural})
            obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
            for key in ("uid", "creationTimestamp"):
                meta[key] = current["metadata"][key]
            if rt.namespaced:
                meta["namespace"] = ns
            _defaults(rt, obj)
            if dry_run:
                return obj
            return self._write("MODIFIED", rt, ns, obj)

    def patch(self, resource: str | ResourceType, namespace: str | None, name: str,
              patch_type: str, body: bytes, *, dry_run: bool = False) -> JSON:
        """Apply a PATCH body of one of the four Kubernetes patch content types."""
        rt = _rt(resource)
        with self._lock:
            try:
                current: JSON | None = self.get(rt, namespace, name)
            except ApiError:
                current = None
            try:
                if patch_type == "application/apply-patch+yaml":
                    applied = yaml.safe_load(body)
                    if not isinstance(applied, dict):
                        raise ApiError(400, "BadRequest", "apply patch must be an object")
                    if current is None:
                        applied.setdefault("metadata", {})["name"] = name
                        return self.create(rt, applied, namespace, dry_run=dry_run)
                    result = _merge_patch(current, applied)
                elif current is None:
                    raise _not_found(rt, name)
                elif patch_type == "application/json-patch+json":
                    result = jsonpatch.JsonPatch(json.loads(body)).apply(current)
                elif patch_type == "application/merge-patch+json":
                    result = _merge_patch(current, json.loads(body))
                elif patch_type == "application/strategic-merge-patch+json":
                    result = strategic_merge(current, json.loads(body))
                else:
                    raise ApiError(415, "UnsupportedMediaType",
                                   f"the body of the request was in an unknown format - "
                                   f"accepted media types include: application/json-patch+json, "
                                   f"application/merge-patch+json, application/apply-patch+yaml, "
                                   f"application/strategic-merge-patch+json ({patch_type!r})")
            except (ValueError, yaml.YAMLError, jsonpatch.JsonPatchException,
                    jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the patch could not be applied: {exc}") from None
            # A patch never moves an object or drops its identity.
            result.setdefault("metadata", {}).update(
                name=name, resourceVersion=current["metadata"]["resourceVersion"])
            return self.replace(rt, result, namespace, dry_run=dry_run)

    def delete(self, resource: str | ResourceType, namespace: str | None, name: str, *,
               dry_run: bool = False, preconditions: JSON | None = None) -> JSON:
        rt = _rt(resource)
        ns = self._ns(rt, namespace)
        with self._lock:
            obj = self._objects.get((rt, ns, name))
            if obj is None:
                raise _not_found(rt, name)
            for key, field_name in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = (preconditions or {}).get(key)
                if wanted is not None and wanted != obj["metadata"].get(key):
                    # DeleteOptions.preconditions, checked as the registry's Store.Delete checks them.
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(rt)} "{name}": '
                                   f"Precondition failed: {field_name} in precondition: {wanted}, "
                                   f"{field_name} in object meta: {obj['metadata'].get(key)}")
            if dry_run:
                return copy.deepcopy(obj)
            del self._objects[(rt, ns, name)]
            if rt.plural == "namespaces":
                for key in [key for key in self._objects if key[0].namespaced and key[1] == name]:
                    self._write("DELETED", key[0], key[1], self._objects.pop(key), store=False)
            deleted = copy.deepcopy(obj)
            deleted["metadata"]["deletionTimestamp"] = _now()
            return self._write("DELETED", rt, ns, deleted, store=False)

    def emit(self, event_type: str, obj: JSON, *, store: bool = True) -> JSON:
        """Feed open watches an event; with ``store`` the store follows it (upsert/delete)."""
        rt = _BY_KIND[(obj["apiVersion"], obj["kind"])]
        ns = self._ns(rt, obj.get("metadata", {}).get("namespace"))
        name = obj["metadata"]["name"]
        with self._lock:
            if not store:
                return self._write(event_type, rt, ns, copy.deepcopy(obj), store=False)
            if event_type == "DELETED":
                return self.delete(rt, ns, name)
            if (rt, ns, name) in self._objects:
                return self.replace(rt, {**obj, "metadata": {
                    **obj["metadata"], "resourceVersion": None}}, ns)
            return self.create(rt, obj, ns)

    # -- watches

    def watch(self, resource: str | ResourceType, namespace: str | None, *,
              resource_version: str | None, label_selector: str | None = None,
              field_selector: str | None = None) -> tuple[_Watcher, builtins.list[WatchEvent]]:
        """Register a watcher; returns it and the events it must send first.

        Without a ``resource_version`` (or ``"0"``) those are synthetic ``ADDED`` events for the
        current objects, as the real apiserver sends; otherwise the history after that version.
        """
        rt = _rt(resource)
        watcher = _Watcher(rt, namespace if rt.namespaced else None, label_selector,
                           field_selector)
        with self._lock:
            if resource_version in (None, "", "0"):
                items, rv = self.list(rt, namespace, label_selector=label_selector,
                                      field_selector=field_selector)
                initial = [WatchEvent("ADDED", rt, item, rv) for item in items]
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise ApiError(400, "BadRequest",
                                   f"invalid resource version: {resource_version}") from None
                oldest = self._history[0].resource_version if self._history else self._rv + 1
                if since < oldest - 1 and len(self._history) == self._history.maxlen:
                    raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest})")
                initial = [event for event in self._history
                           if event.resource_version > since and watcher.wants(event)]
            self._watchers.add(watcher)
            return watcher, initial

    def unwatch(self, watcher: _Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watchers)

    # -- internals

    def _write(self, event_type: str, rt: ResourceType, ns: str, obj: JSON, *,
               store: bool = True) -> JSON:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        if store:
            self._objects[(rt, ns, obj["metadata"]["name"])] = obj
        event = WatchEvent(event_type, rt, copy.deepcopy(obj), self._rv)
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.events.put(event)
        return copy.deepcopy(obj)

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "default") if rt.namespaced else ""


def _rt(resource: str | ResourceType) -> ResourceType:
    return resource if isinstance(resource, ResourceType) else resource_type(resource)


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _defaults(rt: ResourceType, obj: JSON) -> None:
    if rt.plural == "namespaces":
        name = obj["metadata"]["name"]
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
    elif rt.plural == "pods":
        # The fake has no kubelet: pods are running and ready at once.
        containers = obj.get("spec", {}).get("containers") or []
        obj.setdefault("status", {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "",
                 "containerID": "", "ready": True,
                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": _now()}}}
                for c in containers
            ],
        })


# --------------------------------------------------------------------------- request records

@dataclass(frozen=True)
class RecordedRequest:
    """What the fake received: ``headers`` is case-insensitive (``get``, ``getlist``)."""

    method: str
    path: str
    query: str
    headers: Headers
    body_length: int
    #: the request body exactly as it arrived (objects' bodies; upgrades and test endpoints: empty)
    body: bytes = b""

    @property
    def params(self) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(self.query, keep_blank_values=True))


class RequestLog:
    """Thread-safe list of :class:`RecordedRequest` (iterable, ``len``, indexable)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[RecordedRequest] = []

    def append(self, request: RecordedRequest) -> None:
        with self._lock:
            self._items.append(request)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def snapshot(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._items)

    def last(self, path_prefix: str = "/", method: str | None = None) -> RecordedRequest | None:
        """The most recent request whose path starts with ``path_prefix`` (and of ``method``)."""
        for request in reversed(self.snapshot()):
            if request.path.startswith(path_prefix) and method in (None, request.method):
                return request
        return None

    def matching(self, path_prefix: str = "/", method: str | None = None) -> list[RecordedRequest]:
        return [r for r in self.snapshot()
                if r.path.startswith(path_prefix) and method in (None, r.method)]

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __getitem__(self, index: int) -> RecordedRequest:
        with self._lock:
            return self._items[index]


@dataclass(frozen=True)
class RequestInfo:
    """An API request as an authorizer sees it (the real apiserver's ``RequestInfo``)."""

    verb: str  # get list watch create update patch delete deletecollection
    api_group: str
    api_version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    user: str  # ``Impersonate-User`` if present, else the token's service account
    groups: tuple[str, ...]
    method: str
    path: str
    headers: Headers = field(compare=False)

    @property
    def impersonated(self) -> bool:
        return "Impersonate-User" in self.headers


#: An authorizer returns True to allow; False or a reason string denies with 403.
Authorizer = Callable[[RequestInfo], "bool | str"]


@dataclass
class UpgradeRequest:
    """Handed to an ``on_upgrade`` callable: it owns ``sock`` until it returns.

    The callable writes the raw response itself (``101 Switching Protocols`` and the stream,
    or an error) on ``wfile``; the connection is closed afterwards.
    """

    info: RequestInfo
    sock: socket.socket
    rfile: Any
    wfile: Any


SERVICE_ACCOUNT_USER = "system:serviceaccount:kube-system:bcs-kube-agent"
#: Resources a PUT creates when they do not exist (the real registries' AllowCreateOnUpdate).
CREATE_ON_UPDATE = frozenset({"roles", "rolebindings", "clusterroles", "clusterrolebindings", "endpoints"})


# --------------------------------------------------------------------------- HTTP handler

_API_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+)(?=/))?"
    r"/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are separate writes: with Nagle on, the body waits for the
    # client's delayed ACK of the head (~40 ms per keep-alive request).
    disable_nagle_algorithm = True
    server: _Server
    # Idle keep-alive connections end on their own, so ``stop()`` never waits long.
    timeout = 30

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # Tests read ``.requests``; stderr noise helps nobody.

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # -- plumbing

    @property
    def fake(self) -> FakeAPIServer:
        return self.server.fake

    def _dispatch(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.url_path = urllib.parse.unquote(url.path)
        self.params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        self.req_headers = Headers(list(self.headers.items()))
        self._body_length = 0
        recorded = False
        try:
            if self.url_path.startswith("/__"):
                recorded = True
                self._test_endpoint(url.query)
                return
            body = self._read_body(MAX_OBJECT_BODY)
            self._record(url.query, body)
            recorded = True
            self._authenticate()
            self._route(body)
        except ApiError as exc:
            if not recorded:
                self._record(url.query)
            self._send_json(exc.code, exc.status())
        except (ConnectionError, TimeoutError, ssl.SSLError):
            self.close_connection = True
        except Exception as exc:  # A bug in the fake must show up as an answer, not a hang.
            traceback.print_exc()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._send_json(500, ApiError(500, "InternalError",
                                              f"fake apiserver bug: {exc!r}").status())

    def _record(self, query: str, body: bytes = b"") -> None:
        self.fake.requests.append(RecordedRequest(
            self.command, self.url_path, query, self.req_headers, self._body_length, body))

    def _authenticate(self) -> None:
        if self.fake.client_ca is not None and not self.req_headers.get("Authorization"):
            # A client certificate the fake's client CA signed (as kind's admin kubeconfig has).
            peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            if peer:
                return
        scheme, _, token = (self.req_headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.fake.token.encode()):
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _read_body(self, limit: int) -> bytes:
        return b"".join(self._body_chunks(limit))

    def _body_chunks(self, limit: int | None) -> Iterator[bytes]:
        """The request body, sized or chunked, in pieces; over ``limit`` → 413."""
        total = 0
        if "chunked" in (self.req_headers.get("Transfer-Encoding") or "").lower():
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                remaining = size
                while remaining:
                    piece = self.rfile.read(min(remaining, 65536))
                    if not piece:
                        raise ConnectionError("client closed mid-body")
                    remaining -= len(piece)
                    total = self._count(total, len(piece), limit)
                    yield piece
                self.rfile.readline(16)
        else:
            remaining = int(self.req_headers.get("Content-Length") or 0)
            while remaining:
                piece = self.rfile.read(min(remaining, 65536))
                if not piece:
                    raise ConnectionError("client closed mid-body")
                remaining -= len(piece)
                total = self._count(total, len(piece), limit)
                yield piece

    def _count(self, total: int, size: int, limit: int | None) -> int:
        total += size
        self._body_length = total
        if limit is not None and total > limit:
            self.close_connection = True
            raise ApiError(413, "RequestEntityTooLarge", "request entity too large")
        return total

    def _send_json(self, code: int, obj: Any, content_type: str = "application/json") -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_document(self, obj: Any) -> None:
        """A discovery document with an ETag, ``304`` to a matching ``If-None-Match`` — as
        kube-apiserver's discovery handlers answer (``endpoints/discovery/aggregated/etag.go``:
        ``ETag`` quoted, ``Vary: Accept``, ``Cache-Control: public``)."""
        data = json.dumps(obj).encode()
        etag = f'"{hashlib.sha512(data).hexdigest()[:32]}"'
        self.send_response(304 if self.req_headers.get("If-None-Match") == etag else 200)
        self.send_header("ETag", etag)
        self.send_header("Vary", "Accept")
        self.send_header("Cache-Control", "public")
        if self.req_headers.get("If-None-Match") == etag:
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _client_gone(self) -> bool:
        """Whether the client closed its end (it sends nothing while it reads a stream)."""
        sock = self.connection
        try:
            # poll, not select: descriptors beyond 1024 (thousands of watches) are fine.
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            readable = poller.poll(0)
            if not readable and not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return False
            sock.settimeout(0.01)
            try:
                return sock.recv(1) == b""
            finally:
                sock.settimeout(self.timeout)
        except (ssl.SSLWantReadError, TimeoutError, BlockingIOError):
            return False
        except OSError:
            return True

    # -- routing

    def _route(self, body: bytes) -> None:
        path = self.url_path.rstrip("/") or "/"
        if self.command == "GET":
            static = self.fake._static_document(path)
            if static is not None:
                self._send_document(static)
                return
            if path.startswith("/openapi/v3/") and path[len("/openapi/v3/"):] in _OPENAPI_GV:
                self._send_json(200, _openapi_v3(_OPENAPI_GV[path[len("/openapi/v3/"):]]))
                return
            if path == "/openapi/v2":
                data = _openapi_v2_protobuf()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if path.startswith("/openapi/"):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
        match = _API_PATH.match(self.url_path)
        if match is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        group = match["group"] or ""
        version = match["core"] or match["version"]
        try:
            rt = resource_type(match["resource"], group)
        except KeyError:
            raise ApiError(404, "NotFound",
                           "the server could not find the requested resource") from None
        if rt.group != group or rt.version != version:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace, name, sub = match["namespace"] or "", match["name"] or "", match["sub"] or ""
        if namespace and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        info = self._request_info(rt, namespace, name, sub)
        if rt.kind != "SelfSubjectAccessReview":  # every authenticated user may ask
            self.fake._authorize(info)
        if sub:
            self._subresource(rt, info, body)
            return
        self._crud(rt, info, body)

    def _request_info(self, rt: ResourceType, namespace: str, name: str, sub: str) -> RequestInfo:
        method = self.command
        watching = self.params.get("watch") in ("true", "1")
        verb = {
            "GET": "get" if name else ("watch" if watching else "list"),
            "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
        user = self.req_headers.get("Impersonate-User") or SERVICE_ACCOUNT_USER
        groups = tuple(self.req_headers.getlist("Impersonate-Group"))
        return RequestInfo(verb, rt.group, rt.version, rt.plural, sub, namespace, name, user,
                           groups, method, self.url_path, self.req_headers)

    def _crud(self, rt: ResourceType, info: RequestInfo, body: bytes) -> None:
        store = self.fake.store
        ns = info.namespace or None
        dry_run = "dryRun" in self.params
        if info.verb == "get":
            self._send_object(store.get(rt, ns, info.name))
        elif info.verb == "list":
            items, rv = store.list(rt, ns, label_selector=self.params.get("labelSelector"),
                                   field_selector=self.params.get("fieldSelector"))
            if self._wants_table():
                self._send_json(200, _table(rt, items, rv, self.params.get("includeObject")),
                                "application/json")
            else:
                self._send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                                      "metadata": {"resourceVersion": str(rv)}, "items": items})
        elif info.verb == "watch":
            self._watch(rt, ns)
        elif info.verb == "create" and rt.kind == "SelfSubjectAccessReview":
            self._send_json(201, self._access_review(info, _decode(
                body, self.req_headers.get("Content-Type") or "")))
        elif info.verb == "create":
            obj = _decode(body, self.req_headers.get("Content-Type") or "")
            self._send_json(201, store.create(rt, obj, ns, dry_run=dry_run))
        elif info.verb == "update":
            obj = _decode(body, self.req_headers.get("Content-Type") or "")
            if obj.get("metadata", {}).get("name") != info.name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the "
                               "name on the URL")
            if rt.plural in CREATE_ON_UPDATE:
                try:
                    store.get(rt, ns, info.name)
                except ApiError:
                    # As the real apiserver: a PUT creates these when absent, and authorizes
                    # the create too.
                    self.fake._authorize(dataclasses.replace(info, verb="create"))
                    self._send_json(201, store.create(rt, obj, ns, dry_run=dry_run))
                    return
            self._send_json(200, store.replace(rt, obj, ns, dry_run=dry_run))
        elif info.verb == "patch":
            patch_type = (self.req_headers.get("Content-Type") or "").split(";")[0].strip()
            self._send_json(200, store.patch(rt, ns, info.name, patch_type, body,
                                             dry_run=dry_run))
        elif info.verb == "delete":
            options = _decode(body, self.req_headers.get("Content-Type") or "") if body else {}
            dry_run = dry_run or bool(options.get("dryRun"))
            deleted = store.delete(rt, ns, info.name, dry_run=dry_run, preconditions=options.get("preconditions"))
            if rt.plural == "pods":
                self._send_json(200, deleted)
            else:
                self._send_json(200, {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": info.name, "group": rt.group, "kind": rt.plural,
                                "uid": deleted["metadata"]["uid"]}})
        elif info.verb == "deletecollection":
            items, rv = store.list(rt, ns, label_selector=self.params.get("labelSelector"),
                                   field_selector=self.params.get("fieldSelector"))
            for item in items:
                store.delete(rt, item["metadata"].get("namespace"), item["metadata"]["name"],
                             dry_run=dry_run)
            self._send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                                  "metadata": {"resourceVersion": str(rv)}, "items": items})
        else:
            raise ApiError(405, "MethodNotAllowed", f"method {info.method} not allowed")

    def _access_review(self, info: RequestInfo, review: JSON) -> JSON:
        """``kubectl auth can-i``: the authorizer's verdict for the (impersonated) caller."""
        attributes = review.get("spec", {}).get("resourceAttributes") or {}
        asked = RequestInfo(
            attributes.get("verb", ""), attributes.get("group", ""),
            attributes.get("version", ""), attributes.get("resource", ""),
            attributes.get("subresource", ""), attributes.get("namespace", ""),
            attributes.get("name", ""), info.user, info.groups, info.method, info.path,
            info.headers)
        try:
            self.fake._authorize(asked)
            allowed, reason = True, ""
        except ApiError as exc:
            allowed, reason = False, exc.message
        return {**review, "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "status": {"allowed": allowed, **({"reason": reason} if reason else {})}}

    def _send_object(self, obj: JSON) -> None:
        if self._wants_table():
            rt = _BY_KIND[(obj["apiVersion"], obj["kind"])]
            self._send_json(200, _table(rt, [obj], int(obj["metadata"]["resourceVersion"]),
                                        self.params.get("includeObject")))
        else:
            self._send_json(200, obj)

    def _wants_table(self) -> bool:
        return "as=Table" in (self.req_headers.get("Accept") or "")

    def _subresource(self, rt: ResourceType, info: RequestInfo, body: bytes) -> None:
        store = self.fake.store
        if info.subresource == "status" and info.verb in ("get", "update", "patch"):
            if info.verb == "get":
                self._send_json(200, store.get(rt, info.namespace, info.name))
                return
            current = store.get(rt, info.namespace, info.name)
            if info.verb == "update":
                current["status"] = _decode(body).get("status", {})
                self._send_json(200, store.replace(rt, current, info.namespace))
            else:
                patch_type = (self.req_headers.get("Content-Type") or "").split(";")[0].strip()
                self._send_json(200, store.patch(rt, info.namespace, info.name, patch_type, body))
            return
        if rt.plural == "serviceaccounts" and info.subresource == "token" and info.verb == "create":
            # TokenRequest: the one token this fake accepts, for an existing service account.
            store.get(rt, info.namespace, info.name)
            request = _decode(body)
            seconds = int((request.get("spec") or {}).get("expirationSeconds") or 3600)
            expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))
            self._send_json(201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                  "metadata": {"name": info.name, "namespace": info.namespace},
                                  "spec": request.get("spec") or {},
                                  "status": {"token": self.fake.token, "expirationTimestamp": expires}})
            return
        if rt.plural != "pods" or info.subresource not in ("log", "exec", "attach", "portforward"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        store.get(rt, info.namespace, info.name)  # 404 for a missing pod
        if info.subresource == "log":
            self._pod_log(info)
            return
        handler = self.fake._upgrade_handler
        if handler is None or "upgrade" not in (self.req_headers.get("Connection") or "").lower():
            raise ApiError(400, "BadRequest", "Upgrade request required")
        self.close_connection = True
        handler(UpgradeRequest(info, self.connection, self.rfile, self.wfile))

    # -- streams

    def _watch(self, rt: ResourceType, namespace: str | None) -> None:
        store = self.fake.store
        table = self._wants_table()
        timeout = float(self.params.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        watcher, initial = store.watch(
            rt, namespace, resource_version=self.params.get("resourceVersion"),
            label_selector=self.params.get("labelSelector"),
            field_selector=self.params.get("fieldSelector"))
        deadline = time.monotonic() + timeout
        try:
            self._start_stream("application/json")
            for event in initial:
                self._chunk(_event_line(event, table, self.params.get("includeObject")))
            while not self.fake._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    event = watcher.events.get(timeout=min(POLL_SECONDS, remaining))
                except queue.Empty:
                    if self._client_gone():
                        self.close_connection = True
                        return
                    continue
                self._chunk(_event_line(event, table, self.params.get("includeObject")))
            store.unwatch(watcher)  # before the client can see the end of the stream
            self._end_stream()
        except OSError:
            self.close_connection = True
        finally:
            store.unwatch(watcher)

    def _pod_log(self, info: RequestInfo) -> None:
        lines = self.fake.pod_logs.get((info.namespace, info.name),
                                       [f"{info.name} started"])
        if self.params.get("follow") not in ("true", "1"):
            data = "".join(f"{line}\n" for line in lines).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        try:
            self._start_stream("text/plain")
            for line in lines:
                self._chunk(f"{line}\n".encode())
            count = 0
            next_line = time.monotonic() + self.fake.log_interval
            while not self.fake._stopping.is_set():
                if self._client_gone():
                    self.close_connection = True
                    return
                if time.monotonic() >= next_line:
                    count += 1
                    self._chunk(f"{info.name} line {count}\n".encode())
                    next_line += self.fake.log_interval
                time.sleep(min(POLL_SECONDS, self.fake.log_interval))
            self._end_stream()
        except OSError:
            self.close_connection = True

    # -- test endpoints (no authentication: a plain upstream proxy forwards no credentials)

    def _test_endpoint(self, query: str) -> None:
        name = self.url_path.rstrip("/")
        if name == "/__digest" and self.command in ("POST", "PUT"):
            digest = hashlib.sha256()
            for piece in self._body_chunks(None):
                digest.update(piece)
            self._record(query)
            self._send_json(200, {"bytes": self._body_length, "sha256": digest.hexdigest()})
            return
        self._read_body(MAX_OBJECT_BODY)
        self._record(query)
        if name == "/__bytes":
            size = int(self.params.get("n", "0"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = b"x" * 65536
            while size > 0:
                self.wfile.write(block[:size])
                size -= len(block)
        elif name == "/__slow":
            with self.fake._conn_lock:
                self.fake.slow_now += 1
                self.fake.slow_peak = max(self.fake.slow_peak, self.fake.slow_now)
            try:
                self.fake._stopping.wait(float(self.params.get("seconds", "1")))
            finally:
                with self.fake._conn_lock:
                    self.fake.slow_now -= 1
            self._send_json(200, {"slept": float(self.params.get("seconds", "1"))})
        elif name == "/__echo":
            self._send_json(200, {"method": self.command, "path": self.url_path,
                                  "query": query, "headers": dict(self.req_headers.items())})
        else:
            raise ApiError(404, "NotFound", "no such test endpoint")


#: ``/openapi/v3/{key}`` → group/version it describes.
_OPENAPI_GV = {("api/" if "/" not in gv else "apis/") + gv: gv for gv in _GROUPS}
_OPENAPI_HASH = "0" * 16


def _openapi_v3(group_version: str) -> JSON:
    """The smallest OpenAPI v3 document kubectl's field-validation check accepts.

    kubectl (1.27+) looks for a PATCH operation tagged with the kind's
    ``x-kubernetes-group-version-kind`` that lists a ``fieldValidation`` parameter; finding it,
    it sends ``fieldValidation=Strict`` and leaves validation to the server instead of
    downloading schemas. Without any OpenAPI document ``kubectl apply`` refuses to run unless
    given ``--validate=false``. Schemas are omitted, so ``apply`` computes its strategic merge
    patches from kubectl's compiled-in types, as it does for every built-in kind anyway.
    """
    paths: JSON = {}
    for rt in _GROUPS[group_version]:
        prefix = f"/api/{rt.version}" if not rt.group else f"/apis/{rt.group}/{rt.version}"
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[f"{prefix}{scope}/{rt.plural}/{{name}}"] = {"patch": {
            "operationId": f"patch{rt.kind}",
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                for name in ("dryRun", "fieldManager", "fieldValidation", "force")
            ],
            "responses": {"200": {"description": "OK"}},
        }}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1"},
            "paths": paths, "components": {"schemas": {}}}


OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


def _pb(number: int, payload: bytes | str) -> bytes:
    """One length-delimited protobuf field (strings and embedded messages are all we need)."""
    data = payload.encode() if isinstance(payload, str) else payload
    out, value = bytearray(), (number << 3) | 2
    for item in (value, len(data)):
        while item > 0x7F:
            out.append((item & 0x7F) | 0x80)
            item >>= 7
        out.append(item)
    return bytes(out) + data


def _openapi_v2_protobuf() -> bytes:
    """The OpenAPI v2 document as gnostic protobuf, the only v2 encoding kubectl reads.

    kubectl 1.27 has no OpenAPI v3 path for ``apply``: it looks in ``/openapi/v2`` for the same
    ``fieldValidation`` parameter on each kind's PATCH operation (see :func:`_openapi_v3`).
    Field numbers are those of gnostic's ``openapiv2/OpenAPIv2.proto``.
    """
    paths = b""
    for rt in RESOURCE_TYPES:
        prefix = f"/api/{rt.version}" if not rt.group else f"/apis/{rt.group}/{rt.version}"
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        gvk_yaml = f'group: "{rt.group}"\nkind: {rt.kind}\nversion: {rt.version}\n'
        parameters = b"".join(
            # ParametersItem.parameter > Parameter.non_body_parameter >
            # NonBodyParameter.query_parameter_sub_schema {in, name, type}
            _pb(8, _pb(1, _pb(2, _pb(3, _pb(2, "query") + _pb(4, name) + _pb(6, "string")))))
            for name in ("dryRun", "fieldManager", "fieldValidation", "force")
        )
        operation = (
            _pb(5, f"patch{rt.kind}") + parameters
            # Responses.response_code {"200": ResponseValue.response {description}}
            + _pb(9, _pb(1, _pb(1, "200") + _pb(2, _pb(1, _pb(1, "OK")))))
            # vendor_extension NamedAny {name, Any.yaml}
            + _pb(13, _pb(1, "x-kubernetes-group-version-kind") + _pb(2, _pb(2, gvk_yaml)))
        )
        # Paths.path NamedPathItem {name, PathItem.patch}
        paths += _pb(2, _pb(1, f"{prefix}{scope}/{rt.plural}/{{name}}") + _pb(2, _pb(8, operation)))
    info = _pb(1, "Kubernetes") + _pb(2, "v1")
    return _pb(1, "2.0") + _pb(2, info) + _pb(8, paths)


PROTOBUF = "application/vnd.kubernetes.protobuf"


def _pb_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Decode one protobuf message into (field number, varint or bytes) pairs."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 2:
            size = varint()
            yield number, data[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _pb_map(entries: list[bytes], *, binary: bool = False) -> dict[str, str]:
    result = {}
    for entry in entries:
        fields = dict(_pb_fields(entry))
        key, value = fields.get(1, b""), fields.get(2, b"")
        assert isinstance(key, bytes) and isinstance(value, bytes)
        result[key.decode()] = base64.b64encode(value).decode() if binary else value.decode()
    return result


def _pb_object_meta(data: bytes) -> JSON:
    meta: JSON = {}
    labels, annotations = [], []
    for number, value in _pb_fields(data):
        if isinstance(value, bytes):
            if number in (1, 2, 3) and value:
                meta[("name", "generateName", "namespace")[number - 1]] = value.decode()
            elif number == 11:
                labels.append(value)
            elif number == 12:
                annotations.append(value)
    if labels:
        meta["labels"] = _pb_map(labels)
    if annotations:
        meta["annotations"] = _pb_map(annotations)
    return meta


def _decode_protobuf(body: bytes) -> JSON:
    """Decode the few kinds kubectl 1.32+ sends as protobuf (``kubectl create namespace``,
    ``create configmap``, ``create secret``, ``create serviceaccount``).

    The envelope is ``k8s\\0`` + ``runtime.Unknown{typeMeta{apiVersion, kind}, raw}``; field
    numbers are those of ``k8s.io/api/core/v1/generated.proto``. Other kinds → 415.
    """
    if not body.startswith(b"k8s\x00"):
        raise ApiError(400, "BadRequest", "protobuf body without the k8s envelope")
    envelope = dict(_pb_fields(body[4:]))
    type_meta = dict(_pb_fields(envelope.get(1, b"")))  # type: ignore[arg-type]
    api_version = type_meta.get(1, b"").decode()  # type: ignore[union-attr]
    kind = type_meta.get(2, b"").decode()  # type: ignore[union-attr]
    fields: dict[int, list[int | bytes]] = {}
    for number, value in _pb_fields(envelope.get(2, b"")):  # type: ignore[arg-type]
        fields.setdefault(number, []).append(value)
    strings = {n: [v for v in values if isinstance(v, bytes)] for n, values in fields.items()}
    obj: JSON = {"apiVersion": api_version, "kind": kind,
                 "metadata": _pb_object_meta(strings.get(1, [b""])[0])}
    if (api_version, kind) == ("v1", "Namespace"):
        pass
    elif (api_version, kind) == ("v1", "ConfigMap"):
        if 2 in strings:
            obj["data"] = _pb_map(strings[2])
        if 3 in strings:
            obj["binaryData"] = _pb_map(strings[3], binary=True)
    elif (api_version, kind) == ("v1", "Secret"):
        if 2 in strings:
            obj["data"] = _pb_map(strings[2], binary=True)
        if 3 in strings:
            obj["type"] = strings[3][0].decode()
    elif (api_version, kind) == ("authorization.k8s.io/v1", "SelfSubjectAccessReview"):
        # spec(2).resourceAttributes(1): namespace verb group version resource subresource name
        spec = dict(_pb_fields(strings.get(2, [b""])[0]))
        names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
        attributes = {names[n - 1]: v.decode() for n, v in _pb_fields(spec.get(1, b""))  # type: ignore[arg-type]
                      if isinstance(v, bytes) and 1 <= n <= len(names)}
        obj["spec"] = {"resourceAttributes": attributes}
    elif (api_version, kind) != ("v1", "ServiceAccount"):
        raise ApiError(415, "UnsupportedMediaType",
                       f"the fake apiserver cannot decode {kind} from protobuf; send JSON")
    return obj


def _decode(body: bytes, content_type: str = "application/json") -> JSON:
    if content_type.split(";")[0].strip() == PROTOBUF:
        try:
            return _decode_protobuf(body)
        except (ValueError, IndexError, UnicodeDecodeError):
            raise ApiError(400, "BadRequest", "undecodable protobuf body") from None
    try:
        obj = json.loads(body or b"{}")
    except ValueError:
        try:
            obj = yaml.safe_load(body)
        except yaml.YAMLError:
            raise ApiError(400, "BadRequest", "the body is neither JSON nor YAML") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "BadRequest", "the body must be an object")
    return obj


def _event_line(event: WatchEvent, table: bool, include: str | None) -> bytes:
    obj = event.object
    if table:
        obj = _table(event.resource, [obj], event.resource_version, include)
    return json.dumps({"type": event.type, "object": obj}).encode() + b"\n"


def _age(created: str | None) -> str:
    if not created:
        return "<unknown>"
    then = dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    seconds = max(0, int((dt.datetime.now(dt.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _column(name: str, kind: str = "string", fmt: str = "") -> JSON:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": 0}


def _table(rt: ResourceType, items: list[JSON], rv: int, include: str | None) -> JSON:
    """The ``meta.k8s.io/v1`` Table ``kubectl get`` asks for (pods get the real columns)."""
    if rt.plural == "pods":
        columns = [_column("Name", fmt="name"), _column("Ready"), _column("Status"),
                   _column("Restarts", "string"), _column("Age")]
    else:
        columns = [_column("Name", fmt="name"), _column("Age")]
    rows = []
    for obj in items:
        meta = obj.get("metadata", {})
        if rt.plural == "pods":
            statuses = obj.get("status", {}).get("containerStatuses") or []
            ready = sum(1 for status in statuses if status.get("ready"))
            total = len(obj.get("spec", {}).get("containers") or statuses)
            restarts = sum(int(status.get("restartCount", 0)) for status in statuses)
            cells: list[Any] = [meta.get("name"), f"{ready}/{total}",
                                obj.get("status", {}).get("phase", "Pending"), str(restarts),
                                _age(meta.get("creationTimestamp"))]
        else:
            cells = [meta.get("name"), _age(meta.get("creationTimestamp"))]
        if include == "None":
            row_object: JSON | None = None
        elif include == "Object":
            row_object = obj
        else:
            row_object = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                          "metadata": meta}
        row: JSON = {"cells": cells}
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(rv)}, "columnDefinitions": columns, "rows": rows}


# --------------------------------------------------------------------------- the server

class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many kubectl processes and watches at once in some tests.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], fake: FakeAPIServer,
                 context: ssl.SSLContext) -> None:
        self.fake = fake
        self.context = context
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        # The handshake happens in the handler thread, so a slow client never stalls accept().
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            request.do_handshake()
        except (OSError, ssl.SSLError):
            return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # Clients hanging up mid-stream are normal here.


class FakeAPIServer:
    """A Kubernetes apiserver fake over TLS on 127.0.0.1, run in a background thread.

    :param token: the only bearer token accepted; anything else gets a 401 ``Status``.
    :param cert_hosts: names the server certificate carries (tests that connect by address may
        verify the name ``kubernetes`` through a ``tls_server_name`` override).
    :param server_version: ``(major, minor)`` reported at ``/version``.
    :param log_interval: seconds between lines of a ``logs --follow`` stream.

    Attributes: ``url``, ``port``, ``ca_pem`` (str), ``ca_file`` (path of the CA PEM),
    ``requests`` (:class:`RequestLog`), ``store`` (:class:`ObjectStore`), ``pod_logs``
    (``{(namespace, pod): [lines]}``), ``open_watches``.
    """

    def __init__(self, *, token: str = "fake-service-account-token",
                 cert_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "kubernetes"),
                 server_version: tuple[int, int] = (1, 32), log_interval: float = 0.2,
                 host: str = "127.0.0.1", client_ca: trustme.CA | None = None) -> None:
        self.token = token
        #: When set, a client certificate this CA signed authenticates too (no bearer token).
        self.client_ca = client_ca
        self.server_version = server_version
        self.log_interval = log_interval
        self.requests = RequestLog()
        self.store = ObjectStore()
        self.pod_logs: dict[tuple[str, str], list[str]] = {}
        self._authorizer: Authorizer | None = None
        self._upgrade_handler: Callable[[UpgradeRequest], None] | None = None
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        #: ``GET /__slow`` requests being answered now, and the most at once so far.
        self.slow_now = 0
        self.slow_peak = 0

        self._ca = trustme.CA()
        self._cert = self._ca.issue_cert(*cert_hosts)
        self.ca_pem = self._ca.cert_pem.bytes().decode()
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-apiserver-")
        self.ca_file = str(Path(self._tmp.name) / "ca.pem")
        Path(self.ca_file).write_text(self.ca_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["http/1.1"])  # kubectl offers h2; this server speaks 1.1
        self._cert.configure_cert(context)
        if client_ca is not None:
            client_ca.configure_trust(context)
            context.verify_mode = ssl.CERT_OPTIONAL
        self._server = _Server((host, 0), self, context)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None
        self._seed()

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def open_watches(self) -> int:
        return self.store.open_watches

    @property
    def bindings(self) -> list[JSON]:
        """Every RoleBinding and ClusterRoleBinding in the store."""
        return self.store.list("clusterrolebindings")[0] + self.store.list("rolebindings")[0]

    # -- lifecycle

    def start(self) -> FakeAPIServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": 0.1},
                                            name=f"fake-apiserver-{self.port}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and end every open connection and stream (bounded by ``timeout``)."""
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout)
            self._thread = None
        self._server.server_close()
        with self._conn_lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        while self.open_watches and time.monotonic() < deadline:
            time.sleep(0.02)
        self._tmp.cleanup()

    def drop_connections(self) -> None:
        """End every open client connection, as a restarting apiserver would."""
        with self._conn_lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- hooks for tests

    def authorize(self, authorizer: Authorizer | None) -> None:
        """Decide every API request: return True to allow, False or a reason to deny (403)."""
        self._authorizer = authorizer

    def on_upgrade(self, handler: Callable[[UpgradeRequest], None] | None) -> None:
        """Take over ``pods/{name}/exec|attach|portforward`` requests carrying ``Upgrade``."""
        self._upgrade_handler = handler

    def emit(self, event_type: str, obj: JSON, *, store: bool = True) -> JSON:
        """Push a watch event (``ADDED``/``MODIFIED``/``DELETED``); see :meth:`ObjectStore.emit`."""
        return self.store.emit(event_type, obj, store=store)

    def create(self, resource: str, obj: JSON, namespace: str | None = None) -> JSON:
        return self.store.create(resource, obj, namespace)

    # -- internals

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._conn_lock:
            if add:
                self._connections.add(sock)
            else:
                self._connections.discard(sock)

    def _authorize(self, info: RequestInfo) -> None:
        if self._authorizer is None:
            return
        verdict = self._authorizer(info)
        if verdict is True:
            return
        resource = info.resource + (f"/{info.subresource}" if info.subresource else "")
        where = (f' in the namespace "{info.namespace}"' if info.namespace
                 else " at the cluster scope")
        subject = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
        if info.subresource:
            subject += f"/{info.subresource}"
        if info.name:
            subject += f' "{info.name}"'
        message = (f'{subject} is forbidden: User "{info.user}" cannot {info.verb} resource '
                   f'"{resource}" in API group "{info.api_group}"{where}')
        if isinstance(verdict, str) and verdict:
            message += f": {verdict}"
        raise ApiError(403, "Forbidden", message,
                       {"name": info.name, "group": info.api_group, "kind": info.resource})

    def _static_document(self, path: str) -> JSON | None:
        major, minor = self.server_version
        if path == "/version":
            return {"major": str(major), "minor": str(minor),
                    "gitVersion": f"v{major}.{minor}.0", "gitCommit": "0" * 40,
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.23.0", "compiler": "gc", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]}
        if path == "/apis":
            groups = []
            for group_version in _GROUPS:
                if "/" in group_version:
                    group, version = group_version.split("/")
                    entry = {"groupVersion": group_version, "version": version}
                    groups.append({"name": group, "versions": [entry],
                                   "preferredVersion": entry})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        group_version = path.removeprefix("/api/").removeprefix("/apis/")
        if path.startswith(("/api/", "/apis/")) and group_version in _GROUPS:
            resources = []
            for rt in _GROUPS[group_version]:
                resources.append({
                    "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                    "kind": rt.kind, "verbs": list(_VERBS), "shortNames": list(rt.short_names),
                    "categories": list(rt.categories),
                    "storageVersionHash": base64.b64encode(rt.kind.encode()).decode()[:11],
                })
                for sub, kind, verbs in rt.subresources:
                    resources.append({"name": sub, "singularName": "", "namespaced": True,
                                      "kind": kind, "verbs": list(verbs)})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                    "resources": resources}
        if path == "/openapi/v3":
            return {"paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_OPENAPI_HASH}"}
                              for key in _OPENAPI_GV}}
        return None

    def _seed(self) -> None:
        for name in ("default", "kube-system", "kube-public"):
            self.store.create("namespaces", {"metadata": {"name": name}})
        self.store.create("endpoints", {
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": self.host}],
                         "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}],
        })
        self.store.create("services", {
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.port}],
                     "type": "ClusterIP", "clusterIP": "10.0.0.1"},
        })
        # The default user-facing ClusterRoles every cluster has (rules simplified).
        everything = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
        readonly = {"apiGroups": ["", "apps"], "resources": ["*"],
                    "verbs": ["get", "list", "watch"]}
        writer = {"apiGroups": ["", "apps"], "resources": ["*"], "verbs": list(_VERBS)}
        for name, rules in (("cluster-admin", [everything]), ("admin", [writer]),
                            ("edit", [writer]), ("view", [readonly])):
            self.store.create("clusterroles", {
                "metadata": {"name": name,
                             "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": rules})


def rbac_authorizer(server: FakeAPIServer) -> Authorizer:
    """An authorizer backed by the fake's own RBAC objects, for impersonated requests only.

    A request is allowed if a (Cluster)RoleBinding names the user or one of its groups and the
    role it refers to has a rule matching the verb, API group and resource (``*`` wildcards).
    Requests that are not impersonated act as the service account and are always allowed.
    """

    def rule_allows(rule: JSON, info: RequestInfo) -> bool:
        resource = info.resource + (f"/{info.subresource}" if info.subresource else "")
        return (
            any(g in ("*", info.api_group) for g in rule.get("apiGroups", []))
            and any(r in ("*", resource, info.resource) for r in rule.get("resources", []))
            and any(v in ("*", info.verb) for v in rule.get("verbs", []))
        )

    def decide(info: RequestInfo) -> bool:
        if not info.impersonated:
            return True
        for binding in server.bindings:
            scope = binding["metadata"].get("namespace")
            if scope and scope != info.namespace:
                continue
            if not any(
                (s.get("kind") == "User" and s.get("name") == info.user)
                or (s.get("kind") == "Group" and s.get("name") in info.groups)
                for s in binding.get("subjects") or []
            ):
                continue
            ref = binding.get("roleRef", {})
            try:
                role = (server.store.get("clusterroles", None, ref.get("name", ""))
                        if ref.get("kind") == "ClusterRole"
                        else server.store.get("roles", scope, ref.get("name", "")))
            except ApiError:
                continue
            if any(rule_allows(rule, info) for rule in role.get("rules") or []):
                return True
        return False

    return decide
