"""A Kubernetes API request classified exactly as kube-apiserver classifies it.

One pure function, :func:`classify`, turns ``(method, path, query)`` into a frozen
:class:`RequestInfo`: the attributes kube-apiserver's ``RequestInfo`` defines (resource
or not, verb, API prefix, group, version, namespace, resource, subresource, name, parts,
field and label selector), plus what the gateway decides from them — the **admission
operation** (``CREATE``, ``UPDATE``, ``DELETE``, ``CONNECT`` or none) and whether the
request is **long-running**. Admission, audit and the upgrade audit all read this one
value, computed once per request as part of its facts (:func:`bcs_middleware.core.facts.of`,
``bcs.facts``); none of them splits a path itself.

The rules are ported from the Kubernetes sources, and the tests take their table from
``requestinfo_test.go``:

* ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``
  (``NewRequestInfo``): prefixes ``api`` (groupless) and ``apis``; the ``watch`` and
  ``proxy`` verb prefixes (``proxy`` takes no subresource: ``/api/v1/proxy/namespaces/n/
  pods/p/a/b`` is the pod ``p`` with parts ``[pods p a b]``); the verb from the method;
  ``namespaces/{ns}`` followed by anything but ``status``/``finalize`` is a resource in
  that namespace; ``parts[2]`` is the subresource, the rest is not interpreted; a
  nameless ``get`` is a ``list`` or, with ``watch`` not ``0``/``false``, a ``watch``,
  and becomes named when a ``fieldSelector`` requires ``metadata.name`` (if the whole
  ``ListOptions`` decodes, and the name is a valid path segment); a nameless ``delete``
  is a ``deletecollection``; selectors are kept for ``list``, ``watch`` and
  ``deletecollection`` not given by a verb prefix (``AuthorizeWithSelectors``).
* the admission operation, from ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/``
  (``create.go``: CREATE; ``update.go``: UPDATE — CREATE when a PUT creates, which
  only the object's existence tells; ``patch.go``: UPDATE; ``delete.go``: DELETE, for
  a ``deletecollection`` once per deleted item; ``rest.go`` ``ConnectResource``:
  CONNECT) and ``installer.go``, which routes **every** method it registers for a
  connecter — ``proxy``: GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS; ``exec``,
  ``attach``, ``portforward``: GET and POST — to ``ConnectResource``. The gateway
  admits every method on those subresources of pods, nodes and services as CONNECT
  (those the apiserver does not register it answers 405, after admission here): a
  method is never a way around a CONNECT webhook. The deprecated ``/api/v1/proxy/...``
  form is admitted as a CONNECT on ``{resource}/proxy``, the subresource it reached.
* long-running: kube-apiserver's ``BasicLongRunningRequestCheck`` as configured in
  ``pkg/controlplane/apiserver/config.go`` — verbs ``watch`` and ``proxy``, subresources
  ``attach``, ``exec``, ``proxy``, ``log`` and ``portforward``, and ``/debug/pprof/``.

The path given is the **decoded** path the apiserver will see (Go's ``URL.Path``);
the query is the raw query string, read with Go's ``url.ParseQuery`` rules
(:func:`parse_query`): a pair holding ``;`` or a bad ``%`` escape is dropped, ``+`` is
a space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .cache import Cache
from .selectors import SelectorError, field_selector_exact, parse_label_selector

__all__ = [
    "CONNECTERS",
    "AdmissionOperation",
    "RequestInfo",
    "classify",
    "parse_query",
]

AdmissionOperation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]

_API_PREFIXES = frozenset({"api", "apis"})
_GROUPLESS_PREFIXES = frozenset({"api"})
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_SPECIAL_VERBS_NO_SUBRESOURCES = frozenset({"proxy"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_VERBS_WITH_SELECTORS = frozenset({"list", "watch", "deletecollection"})
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}
_OPERATIONS: dict[str, AdmissionOperation] = {
    "create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE", "deletecollection": "DELETE",
}
_LONG_RUNNING_VERBS = frozenset({"watch", "proxy"})
_LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "proxy", "log", "portforward"})

#: The core (``/api``) resources whose subresources are connecters (``pkg/registry/core``:
#: pod ``ExecREST``, ``AttachREST``, ``PortForwardREST``, ``ProxyREST``; node and service
#: ``ProxyREST``), and the methods ``installer.go`` registers for each.
CONNECTERS: dict[tuple[str, str], frozenset[str]] = {
    ("pods", "exec"): frozenset({"GET", "POST"}),
    ("pods", "attach"): frozenset({"GET", "POST"}),
    ("pods", "portforward"): frozenset({"GET", "POST"}),
    ("pods", "proxy"): frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}),
    ("nodes", "proxy"): frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}),
    ("services", "proxy"): frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}),
}
_CONNECT_RESOURCES = frozenset(resource for resource, _ in CONNECTERS)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """kube-apiserver's ``RequestInfo`` of one request, and what the gateway decides from it.

    :param is_resource: an API resource (or subresource) request, not a non-resource URL.
    :param path: the decoded URL path, as the apiserver sees it.
    :param verb: ``get list watch create update patch delete deletecollection proxy``
        for resource requests (``""`` for another method); the lower-case method otherwise.
    :param parts: the path parts from the resource on: ``(resource, name, subresource, ...)``.
    :param field_selector: ``fieldSelector`` of a list, watch or deletecollection.
    :param label_selector: ``labelSelector`` of a list, watch or deletecollection.
    :param admission_operation: what admission sees the request as, ``None``: not admitted.
    :param long_running: held open (watch, proxy, exec, attach, port-forward, logs).
    """

    is_resource: bool
    path: str
    verb: str
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = ()
    field_selector: str = ""
    label_selector: str = ""
    admission_operation: AdmissionOperation | None = None
    long_running: bool = False

    @property
    def connect(self) -> bool:
        """A request a connecter serves (exec, attach, port-forward, proxy)."""
        return self.admission_operation == "CONNECT"

    @property
    def connect_subresource(self) -> str:
        """The connecter's subresource: ``proxy`` also for the ``/proxy/`` verb prefix."""
        return "proxy" if self.verb == "proxy" else self.subresource


def parse_query(query: str) -> dict[str, list[str]]:
    """``query`` as Go's ``url.ParseQuery`` reads it (the values the apiserver decodes).

    ``query`` is the WSGI ``QUERY_STRING`` (bytes as latin-1). A ``key=value`` piece
    containing ``;`` or a malformed ``%`` escape is skipped, as Go skips it; ``+`` is a
    space; the decoded bytes are read as UTF-8 with U+FFFD for invalid sequences, which
    is what Go's JSON encoder writes for them (what a webhook would be shown).
    """
    values: dict[str, list[str]] = {}
    for piece in query.split("&"):
        if ";" in piece or not piece:
            continue
        key, _, value = piece.partition("=")
        decoded_key, decoded_value = _go_unescape(key), _go_unescape(value)
        if decoded_key is None or decoded_value is None:
            continue
        values.setdefault(decoded_key, []).append(decoded_value)
    return values


def _go_unescape(text: str) -> str | None:
    """Go's ``QueryUnescape``: ``None`` for a ``%`` not followed by two hex digits."""
    if "%" not in text and "+" not in text:
        return text if text.isascii() else text.encode("latin-1", "replace").decode("utf-8", "replace")
    out = bytearray()
    i, raw = 0, text.encode("latin-1", "replace")
    while i < len(raw):
        byte = raw[i]
        if byte == 0x25:  # %
            pair = raw[i + 1:i + 3]
            if len(pair) != 2 or not all(c in b"0123456789abcdefABCDEF" for c in pair):
                return None
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if byte == 0x2B else byte)  # + is a space in a query
        i += 1
    return out.decode("utf-8", "replace")


def _split_path(path: str) -> list[str]:
    trimmed = path.strip("/")
    return trimmed.split("/") if trimmed else []


def _valid_path_segment_name(name: str) -> bool:
    """``path.IsValidPathSegmentName`` (k8s.io/apimachinery/pkg/api/validation/path)."""
    return name not in (".", "..") and "/" not in name and "%" not in name


def _int64(values: list[str] | None) -> bool:
    """Whether ``Convert_Slice_string_To_int64`` accepts the parameter (absent is fine)."""
    if not values:
        return True
    text = values[0]
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit() and -(2**63) <= int(text) < 2**63


def _list_options(query: dict[str, list[str]]) -> tuple[bool, str | None]:
    """``(watch, name)`` from ``ListOptions`` as the apiserver decodes them.

    A parameter that fails to decode (a selector that does not parse, a non-integer
    ``limit`` or ``timeoutSeconds``) fails the whole decode: the name is then not taken
    from the field selector, and only ``watch`` is read, straight from the query.
    """
    watch_values = query.get("watch") or []
    # Convert_Slice_string_To_bool: only "0" and "false" (any case) are false, even "".
    watch = bool(watch_values) and watch_values[0].lower() not in ("0", "false")
    try:
        if not (_int64(query.get("limit")) and _int64(query.get("timeoutSeconds"))):
            return watch, None
        if query.get("labelSelector"):
            parse_label_selector(query["labelSelector"][0])
        if query.get("fieldSelector"):
            name = field_selector_exact(query["fieldSelector"][0], "metadata.name")
            return watch, name if name is not None and _valid_path_segment_name(name) else None
    except SelectorError:
        return watch, None
    return watch, None


def classify(method: str, path: str, query: str = "") -> RequestInfo:
    """The :class:`RequestInfo` of ``method path?query`` (``path`` decoded, ``query`` raw)."""
    return _classified((method, path, query))


# Clients repeat their requests (lists, watches, gets of the same objects): a request
# line is classified once. Bounded: 1024 entries of at most _CACHED characters.
_CACHED = 1024


def _classify(method: str, path: str, query: str) -> RequestInfo:
    method = method.upper()
    plain = RequestInfo(is_resource=False, path=path, verb=method.lower(),
                        long_running=path.startswith("/debug/pprof/"))
    parts = _split_path(path)
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return plain
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix not in _GROUPLESS_PREFIXES:
        if len(parts) < 3:  # one part (the prefix) is already consumed: four in all
            return plain
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    via_prefix = parts[0] in _SPECIAL_VERBS
    if via_prefix:
        if len(parts) < 2:
            # The apiserver answers an error, with the request info known so far.
            return RequestInfo(is_resource=True, path=path, verb=method.lower(), api_prefix=prefix,
                               api_group=group, api_version=version)
        verb, parts = parts[0], parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb not in _SPECIAL_VERBS_NO_SUBRESOURCES else ""
    decoded_query: dict[str, list[str]] | None = None
    if not name and verb == "get":
        decoded_query = parse_query(query)
        watch, selected = _list_options(decoded_query)
        verb = "watch" if watch else "list"
        name = selected or ""
    if not name and verb == "delete":
        verb = "deletecollection"
    field_selector = label_selector = ""
    if not via_prefix and verb in _VERBS_WITH_SELECTORS:
        decoded_query = parse_query(query) if decoded_query is None else decoded_query
        field_selector = (decoded_query.get("fieldSelector") or [""])[0]
        label_selector = (decoded_query.get("labelSelector") or [""])[0]
    operation: AdmissionOperation | None = _OPERATIONS.get(verb)
    if group == "" and prefix == "api" and (
        (verb == "proxy" and resource in _CONNECT_RESOURCES)
        or (resource, subresource) in CONNECTERS
    ):
        operation = "CONNECT"
    return RequestInfo(
        is_resource=True, path=path, verb=verb, api_prefix=prefix, api_group=group, api_version=version,
        namespace=namespace, resource=resource, subresource=subresource, name=name, parts=tuple(parts),
        field_selector=field_selector, label_selector=label_selector, admission_operation=operation,
        long_running=verb in _LONG_RUNNING_VERBS or subresource in _LONG_RUNNING_SUBRESOURCES,
    )


_classified: Cache[tuple[str, str, str], RequestInfo] = Cache(
    max_entries=1024, loader=lambda key: _classify(*key),
    admit=lambda key: len(key[1]) + len(key[2]) <= _CACHED)
