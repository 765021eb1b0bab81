"""The objects kube-apiserver admits for CONNECT and DELETE, built as it builds them.

**CONNECT** (``handlers/rest.go`` ``ConnectResource``): the AdmissionReview's ``object`` is
the connecter's options decoded from the query (and, for ``proxy``, the path after the
subresource), ``oldObject`` and ``options`` are null, ``dryRun`` is false (a ``dryRun``
parameter is refused: "dryRun is not supported"). The options types are those of the
connecters in ``pkg/registry/core/{pod,node,service}/rest`` — ``PodExecOptions``,
``PodAttachOptions``, ``PodPortForwardOptions``, ``PodProxyOptions``,
``NodeProxyOptions``, ``ServiceProxyOptions`` (``core/v1``) — with the ``url.Values``
conversions of ``pkg/apis/core/v1`` (a flag is true unless its first value is ``0`` or
``false``; ``container`` is the first value; ``command`` every value; ``ports`` every
value split at commas, each a 16-bit unsigned number) and the JSON names and
``omitempty`` of ``k8s.io/api/core/v1`` (``command`` is written even when empty: null).
The ``path`` of a proxy is ``getRequestOptions``'s: the parts after the subresource
joined by ``/``, with a leading ``/`` and the request's trailing ``/``.

After admission the gateway forwards what was admitted, not what the client sent:
:func:`connect_target` renders the (possibly patched) options back into the path and
query the apiserver decodes them from, and checks that it decodes exactly them.

**DELETE** (``handlers/delete.go``): ``options`` is the ``DeleteOptions`` of the body
when there is one, else of the query (``gracePeriodSeconds``, ``orphanDependents``,
``propagationPolicy``, ``dryRun``, ``ignoreStoreReadErrorWithClusterBreakingPotential``),
checked by ``ValidateDeleteOptions`` and typed ``meta.k8s.io/v1``; ``oldObject`` is the
object deleted, ``object`` is null.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import quote, unquote

from ..core.bodies import parse_json
from ..core.errors import BadRequest, BCSError
from ..core.paths import encode_path, safe_rest
from ..core.requestinfo import RequestInfo, classify, parse_query

__all__ = ["connect_options", "connect_target", "delete_body", "delete_options"]

#: (resource, subresource) → the options kind its connecter decodes.
_CONNECT_KINDS = {
    ("pods", "exec"): "PodExecOptions",
    ("pods", "attach"): "PodAttachOptions",
    ("pods", "portforward"): "PodPortForwardOptions",
    ("pods", "proxy"): "PodProxyOptions",
    ("nodes", "proxy"): "NodeProxyOptions",
    ("services", "proxy"): "ServiceProxyOptions",
}
_STREAM_FLAGS = ("stdin", "stdout", "stderr", "tty")


def _flag(values: list[str] | None) -> bool:
    """``runtime.Convert_Slice_string_To_bool``: false only for a first value of 0/false."""
    return bool(values) and (values or [""])[0].lower() not in ("0", "false")


def _ports(values: list[str]) -> list[int]:
    """``metav1.Convert_Slice_string_To_Slice_int32`` (ports as ``strconv.ParseUint(v, 10, 16)``)."""
    ports = []
    for value in values:
        for piece in value.split(","):
            if not (piece.isascii() and piece.isdigit()) or int(piece) > 0xFFFF:
                raise BadRequest(f'cannot convert to []int32: strconv.ParseUint: parsing "{piece}": '
                                 "invalid syntax", code_name="BAD_CONNECT_OPTIONS")
            ports.append(int(piece))
    return ports


def _proxy_path(info: RequestInfo) -> str:
    """``getRequestOptions``: the parts after the subresource (or the name, for the verb prefix)."""
    start = 2 if info.verb == "proxy" else 3
    path = "/".join(info.parts[start:])
    if path and not path.startswith("/"):
        path = "/" + path
    if info.path.endswith("/") and not path.endswith("/"):
        path += "/"
    return path


def connect_options(info: RequestInfo, query: str) -> dict[str, Any]:
    """The options object of a CONNECT request (see the module doc), as the webhook gets it."""
    kind = _CONNECT_KINDS[info.resource, info.connect_subresource]
    values = parse_query(query)
    options: dict[str, Any] = {"kind": kind, "apiVersion": "v1"}
    if kind in ("PodExecOptions", "PodAttachOptions"):
        for flag in _STREAM_FLAGS:
            if _flag(values.get(flag)):
                options[flag] = True
        if values.get("container") and values["container"][0]:
            options["container"] = values["container"][0]
        if kind == "PodExecOptions":
            options["command"] = values.get("command") or None
    elif kind == "PodPortForwardOptions":
        ports = _ports(values["ports"]) if values.get("ports") else []
        if ports:
            options["ports"] = ports
    else:
        path = _proxy_path(info)
        if path:
            options["path"] = path
    return options


def _object_prefix(info: RequestInfo) -> str:
    """``/api/{v}[/proxy][/namespaces/{ns}]/{resource}/{name}``, percent-encoded."""
    scope = f"/namespaces/{encode_path(info.namespace)}" if info.namespace else ""
    verb = "/proxy" if info.verb == "proxy" else ""
    group = f"/{encode_path(info.api_group)}" if info.api_group else ""
    return (f"/{info.api_prefix}{group}/{encode_path(info.api_version)}{verb}{scope}"
            f"/{encode_path(info.resource)}/{encode_path(info.name)}")


def _options_query(options: dict[str, Any]) -> str:
    pairs: list[tuple[str, str]] = [(flag, "true") for flag in _STREAM_FLAGS if options.get(flag) is True]
    if options.get("container"):
        pairs.append(("container", str(options["container"])))
    pairs += [("command", str(arg)) for arg in options.get("command") or ()]
    pairs += [("ports", str(port)) for port in options.get("ports") or ()]
    return "&".join(f"{key}={quote(value, safe='')}" for key, value in pairs)


def connect_target(info: RequestInfo, options: dict[str, Any], query: str) -> tuple[str, str]:
    """The (percent-encoded path, query) that carry ``options`` to the apiserver.

    Exec, attach and port-forward: the options alone make the query (nothing else in it
    reaches the kubelet). A proxy: the path carries ``path``, the query is the client's
    (the apiserver passes it on to the proxied server untouched, and admits none of it).
    Refuses (500) options that the apiserver would not decode back to the same object —
    only a webhook's patch can make such options.
    """
    options = _as_decoded(options)
    prefix = _object_prefix(info)
    if info.connect_subresource == "proxy":
        path = options.get("path") or ""
        if not isinstance(path, str):
            raise _not_forwardable("path is not a string")
        try:
            tail = "/" + safe_rest(path[1:]) if path.startswith("/") else (safe_rest(path) if path else "")
        except BadRequest:
            raise _not_forwardable("its path has '.' or '..' segments") from None
        sub = "" if info.verb == "proxy" else "/proxy"
        if tail and not tail.startswith("/"):
            tail = "/" + tail
        target_path, target_query = prefix + sub + tail, query
    else:
        target_path, target_query = f"{prefix}/{info.subresource}", _options_query(options)
    # The apiserver classifies the decoded path; every method on a connecter is the same CONNECT.
    again = classify("GET", unquote(target_path), target_query)
    try:
        same = again.connect and connect_options(again, target_query) == options
    except BadRequest:
        same = False
    if not same:
        raise _not_forwardable("the apiserver would read other options from the request that carries them")
    return target_path, target_query


def _as_decoded(options: dict[str, Any]) -> dict[str, Any]:
    """Admitted options as the apiserver decodes a webhook's patched JSON of them: its zero
    values (``false``, ``""``, ``[]``, null) are fields left out (``omitempty``)."""
    decoded = {key: value for key, value in options.items() if value not in (False, "", None, [])}
    if options.get("kind") == "PodExecOptions":
        decoded.setdefault("command", None)  # written even when empty: null
    return decoded


def _not_forwardable(why: str) -> BCSError:
    return BCSError(f"the admitted connect options cannot be sent on: {why}", status=500,
                    code_name="ADMISSION_PATCH_FAILED")


# -- DELETE ------------------------------------------------------------------------------------

_PROPAGATION = ("Foreground", "Background", "Orphan")
_DELETE_VERSIONS = ("", "v1", "meta.k8s.io/v1", "meta.k8s.io/v1beta1")


def _bad(message: str) -> BadRequest:
    return BadRequest(message, code_name="BAD_DELETE_OPTIONS")


def _int64_value(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise _bad(f"{where} must be a 64-bit integer")
    return value


def _query_options(query: str) -> dict[str, Any]:
    values = parse_query(query)
    options: dict[str, Any] = {}
    if values.get("gracePeriodSeconds"):
        text = values["gracePeriodSeconds"][0]
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()):
            raise _bad(f'gracePeriodSeconds: strconv.ParseInt: parsing "{text}": invalid syntax')
        options["gracePeriodSeconds"] = _int64_value(int(text), "gracePeriodSeconds")
    for flag in ("orphanDependents", "ignoreStoreReadErrorWithClusterBreakingPotential"):
        if values.get(flag):
            options[flag] = _flag(values[flag])
    if values.get("propagationPolicy"):
        options["propagationPolicy"] = values["propagationPolicy"][0]
    if values.get("dryRun"):
        options["dryRun"] = values["dryRun"]
    return options


def _body_options(body: bytes) -> dict[str, Any]:
    document = parse_json(body, what="the DeleteOptions body")
    if not isinstance(document, dict):
        raise _bad("the body of a DELETE must be a DeleteOptions object")
    if document.get("kind", "DeleteOptions") not in ("DeleteOptions", ""):
        raise _bad(f"the body of a DELETE must be a DeleteOptions, not {str(document.get('kind'))[:64]!r}")
    if document.get("apiVersion", "") not in _DELETE_VERSIONS:
        raise _bad(f"no DeleteOptions of apiVersion {str(document.get('apiVersion'))[:64]!r}")
    options: dict[str, Any] = {}
    if document.get("gracePeriodSeconds") is not None:
        options["gracePeriodSeconds"] = _int64_value(document["gracePeriodSeconds"], "gracePeriodSeconds")
    preconditions = document.get("preconditions")
    if preconditions is not None:
        if not isinstance(preconditions, dict):
            raise _bad("preconditions must be an object")
        kept = {}
        for key in ("uid", "resourceVersion"):
            value = preconditions.get(key)
            if value is not None and not isinstance(value, str):
                raise _bad(f"preconditions.{key} must be a string")
            if value is not None:
                kept[key] = value
        options["preconditions"] = kept
    for flag in ("orphanDependents", "ignoreStoreReadErrorWithClusterBreakingPotential"):
        if document.get(flag) is not None:
            if not isinstance(document[flag], bool):
                raise _bad(f"{flag} must be a boolean")
            options[flag] = document[flag]
    if document.get("propagationPolicy") is not None:
        if not isinstance(document["propagationPolicy"], str):
            raise _bad("propagationPolicy must be a string")
        options["propagationPolicy"] = document["propagationPolicy"]
    if document.get("dryRun") is not None:
        dry_run = document["dryRun"]
        if not isinstance(dry_run, list) or not all(isinstance(v, str) for v in dry_run):
            raise _bad("dryRun must be a list of strings")
        if dry_run:
            options["dryRun"] = dry_run
    return options


def delete_options(body: bytes, query: str) -> dict[str, Any]:
    """The ``DeleteOptions`` of a DELETE: of its body when it has one, else of its query.

    Unknown fields are dropped, as the apiserver's decoder drops them; a field of the
    wrong type is a 400; ``ValidateDeleteOptions``'s rules are a 422.
    """
    options = _body_options(body) if body else _query_options(query)
    problems = []
    if "orphanDependents" in options and "propagationPolicy" in options:
        problems.append("propagationPolicy: orphanDependents and deletionPropagation cannot be both set")
    if "propagationPolicy" in options and options["propagationPolicy"] not in _PROPAGATION:
        problems.append(f"propagationPolicy: Unsupported value: {options['propagationPolicy']!r}")
    if any(value != "All" for value in options.get("dryRun", ())):
        problems.append('dryRun: Unsupported value: supported values: "All"')
    if problems:
        raise BCSError('DeleteOptions.meta.k8s.io "" is invalid: ' + "; ".join(problems), status=422,
                       code_name="INVALID_DELETE_OPTIONS")
    return {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", **options}


def delete_body(options: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The admitted options as the DELETE's body, guarded to the object admission saw.

    The preconditions the client gave stay (the apiserver checks them); the ones it left
    out are the ``uid`` and ``resourceVersion`` of the object read for admission, so a
    different object (recreated under the name) or a changed one is not deleted unadmitted:
    the apiserver answers 409 Conflict instead.
    """
    meta = current.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    guard = {key: meta[key] for key in ("uid", "resourceVersion") if isinstance(meta.get(key), str) and meta[key]}
    body = copy.deepcopy(options)
    body["preconditions"] = {**guard, **body.get("preconditions", {})}
    return body
