"""Kubernetes admission of one request: the operation the apiserver will perform, and its objects.

kube-apiserver runs admission inside its handlers, with what only they know; the gateway
works the same facts out before it forwards (``staging/src/k8s.io/apiserver/pkg/endpoints/
handlers/``):

* **POST** is CREATE, **PATCH** is UPDATE of the object the patch (JSON Patch or merge
  patch) turns the current one into (``patch.go``), and **PUT** is UPDATE when the object
  exists and CREATE when it does not (``update.go``: only the object's existence tells) —
  the current object read from the cluster *as the caller*;
* **DELETE** is admitted with ``oldObject`` the object and ``options`` its
  DeleteOptions (``delete.go``), then carries those options with preconditions so only
  the object the webhooks saw is deleted; a deletecollection cannot be admitted item by
  item here;
* **CONNECT** (exec, attach, port-forward, proxy; ``rest.go`` ``ConnectResource``) is
  admitted on the connect options decoded from the query and path, and what goes on is
  the request rebuilt from the admitted options.

What goes upstream is the admitted object re-encoded, never the client's bytes. The WSGI
layer (:mod:`bcs_middleware.layers.admission`) decides *whether* a request is admitted and
renders errors; this module decides *what* is admitted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote

import jsonpatch

from ..core import environ as env
from ..core import facts as request_facts
from ..core import gojson
from ..core.bodies import BufferBudget, parse_json, read_buffer, replace_body
from ..core.errors import BadGateway, BadRequest, BCSError, NotFound, UnsupportedMediaType
from ..core.printable import escape
from ..core.requestinfo import RequestInfo, parse_query
from ..core.routes import KUBERNETES_PREFIX
from .engine import AdmissionEngine, Operation, Outcome
from .options import connect_options, connect_target, delete_body, delete_options
from .review import RequestAttributes, admission_attributes, apply_json_patch, apply_merge_patch

__all__ = ["KubernetesAdmission"]

log = logging.getLogger(__name__)

# A cluster's own webhook (and admission policy) configurations: the kube-apiserver calls no
# webhook for these (k8s.io/apiserver .../webhook/predicates/rules.IsExemptAdmissionConfigurationResource),
# so the gateway, which must not be stricter than the cluster it fronts, does not either.
_REGISTRATION_GROUP = "admissionregistration.k8s.io"
_EXEMPT_REGISTRATION_RESOURCES = frozenset({
    "mutatingwebhookconfigurations", "validatingwebhookconfigurations",
    "validatingadmissionpolicies", "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
})
_JSON_PATCH = "application/json-patch+json"
_MERGE_PATCH = "application/merge-patch+json"


class KubernetesAdmission:
    """Admit one Kubernetes request against a cluster's webhook configurations.

    :param engine: the admission engine (definitions, webhook calls, the cluster reader).
    :param max_body: the largest request body read for admission.
    """

    def __init__(self, engine: AdmissionEngine, *, max_body: int) -> None:
        self.engine = engine
        self.max_body = max_body

    def admit(
        self, environ: dict[str, Any], method: str, cluster_id: str, info: RequestInfo, *,
        slot: BufferBudget.Slot,
    ) -> Outcome | None:
        attrs = admission_attributes(info)
        if attrs is None or (
            attrs.group == _REGISTRATION_GROUP and attrs.resource in _EXEMPT_REGISTRATION_RESOURCES
        ):
            return None
        if info.admission_operation == "CONNECT":
            return self._connect(environ, cluster_id, info, attrs)
        if info.admission_operation == "DELETE":
            return self._delete(environ, cluster_id, info, attrs)
        if method not in ("POST", "PUT", "PATCH"):
            return None  # a create or update verb only these methods carry
        return self._write(environ, method, cluster_id, attrs, slot)

    def _write(
        self, environ: dict[str, Any], method: str, cluster_id: str, attrs: RequestAttributes,
        slot: BufferBudget.Slot,
    ) -> Outcome | None:
        """CREATE or UPDATE (POST, PUT, PATCH), as ``create.go``, ``update.go`` and ``patch.go`` admit them.

        The body is read only when a webhook of a possible operation matches; what goes on is
        the admitted object re-encoded (a PATCH: a guarded patch to it).
        """
        # The operation the apiserver will perform: POST creates, PATCH updates, and PUT
        # updates an object that exists but creates one that does not.
        candidates: tuple[Operation, ...] = (
            ("CREATE",) if method == "POST" else ("UPDATE",) if method == "PATCH" else ("CREATE", "UPDATE")
        )
        matched = {op: self.engine.k8s_matching(cluster_id, op, attrs) for op in candidates}
        first = next((hooks[0].name for hooks in matched.values() if hooks), None)
        if first is None:
            return None
        content_type = _mime(environ)
        _refuse_unadmittable_media_type(method, content_type, first)
        slot.reserve_for(environ, self.max_body)
        body = read_buffer(environ, self.max_body, what="a request body to admit")
        document = parse_json(body, measure=slot.fit)
        del body
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        dry_run = "All" in query.get("dryRun", [])
        write = self._proposed(environ, method, cluster_id, attrs, document, content_type)
        if not isinstance(write.obj, dict):
            raise BadRequest("request body must be a JSON object")
        webhooks = matched[write.operation]
        if not webhooks:
            # Decoded, though no webhook of this operation judged it: the re-encoding goes on.
            replace_body(environ, gojson.dumps(write.obj))
            return None
        outcome = self.engine.admit_k8s(
            cluster_id,
            write.operation,
            attrs,
            write.obj,
            write.old,
            env.get_user(environ),
            dry_run=dry_run,
            options=_options(write.operation, query),
            webhooks=webhooks,
        )
        _forward_admitted(environ, method, write, outcome)
        return outcome

    def _proposed(
        self, environ: dict[str, Any], method: str, cluster_id: str, attrs: RequestAttributes,
        document: Any, content_type: str,
    ) -> _Write:
        """The operation, the object it proposes and the current one, read as the caller."""
        if method == "PATCH":
            old = self._current(environ, cluster_id, attrs, required=True)
            return _Write("UPDATE", _patched(old, document, content_type), old)
        if method == "PUT":
            old = self._current(environ, cluster_id, attrs, required=False)
            return _Write("UPDATE" if old is not None or attrs.subresource else "CREATE", document, old)
        return _Write("CREATE", document, None)

    def _connect(
        self, environ: dict[str, Any], cluster_id: str, info: RequestInfo, attrs: RequestAttributes
    ) -> Outcome | None:
        """CONNECT (exec, attach, port-forward, proxy) as ``ConnectResource`` admits it.

        The webhooks get the connect options decoded from the query and path; what goes on
        is the request rebuilt from the options they admitted (a mutating webhook may
        change them, as it may on the apiserver), never the client's own query.
        """
        webhooks = self.engine.k8s_matching(cluster_id, "CONNECT", attrs)
        if not webhooks:
            return None
        query = str(environ.get("QUERY_STRING", ""))
        if "dryRun" in parse_query(query):
            raise BadRequest("dryRun is not supported", code_name="DRY_RUN_UNSUPPORTED")
        options = connect_options(info, query)
        outcome = self.engine.admit_k8s(
            cluster_id, "CONNECT", attrs, options, None, env.get_user(environ),
            dry_run=False, options=None, webhooks=webhooks,
        )
        admitted = outcome.object if isinstance(outcome.object, dict) else options
        path, forwarded_query = connect_target(info, admitted, query)
        upstream = env.get_upstream(environ)
        if upstream is not None:
            environ[env.UPSTREAM] = dataclasses.replace(upstream, path=path, query=forwarded_query)
        else:  # no routing in front: the next layer reads the request itself
            facts = request_facts.of(environ)
            prefix = KUBERNETES_PREFIX + facts.cluster_id if facts.cluster_id is not None else ""
            environ["PATH_INFO"] = prefix + unquote(path)
            environ["QUERY_STRING"] = forwarded_query
            for key in ("RAW_URI", "REQUEST_URI"):
                environ.pop(key, None)
        request_facts.reclassified(environ, path, forwarded_query)
        return outcome

    def _delete(
        self, environ: dict[str, Any], cluster_id: str, info: RequestInfo, attrs: RequestAttributes
    ) -> Outcome | None:
        """DELETE as ``handlers/delete.go`` admits it: ``oldObject`` the object, ``options`` its DeleteOptions.

        The object is read as the caller. The DELETE goes on carrying the admitted options
        as its body, with preconditions on the uid and resourceVersion read, so only the
        object the webhooks saw can be deleted. A deletecollection is admitted by the
        apiserver once per item it deletes, which the gateway cannot do: refused when a
        ``Fail`` webhook matches it, passed with a ``Warning`` (and logged) for ``Ignore``.
        """
        webhooks = self.engine.k8s_matching(cluster_id, "DELETE", attrs)
        if not webhooks:
            return None
        if info.verb == "deletecollection" or not attrs.name:
            failing = [w.name for w in webhooks if w.failure_policy == "Fail"]
            if failing:
                raise BCSError(
                    f'webhook "{failing[0]}" (failurePolicy: Fail) admits the DELETE of {attrs.resource}, and the '
                    "gateway cannot send a deletecollection to admission item by item: delete the objects one "
                    "by one",
                    status=501,
                    code_name="ADMISSION_OPERATION_UNSUPPORTED",
                )
            for webhook in webhooks:
                log.warning("admission: a deletecollection of %s is not sent to webhook %s (failurePolicy: Ignore)",
                            escape(attrs.resource), webhook.name)
            return Outcome(None, webhooks=(), warnings=tuple(
                f'deletecollection not sent to admission webhook "{w.name}" (failurePolicy: Ignore)' for w in webhooks))
        content_type = _mime(environ)
        body = bytes(read_buffer(environ, self.max_body, what="a DeleteOptions body"))
        if body and content_type not in ("application/json", ""):
            raise UnsupportedMediaType(
                f'a {content_type} DeleteOptions body cannot be admitted by webhook "{webhooks[0].name}": '
                "send application/json"
            )
        options = delete_options(body, str(environ.get("QUERY_STRING", "")))
        old = self._current(environ, cluster_id, attrs, required=True)
        outcome = self.engine.admit_k8s(
            cluster_id, "DELETE", attrs, None, old, env.get_user(environ),
            dry_run=bool(options.get("dryRun")), options=options, webhooks=webhooks,
        )
        replace_body(environ, gojson.dumps(delete_body(options, old)), content_type="application/json")
        return outcome

    def _current(
        self, environ: dict[str, Any], cluster_id: str, attrs: RequestAttributes, *, required: bool
    ) -> Any:
        """The object the request acts on, read as its caller; ``None`` when it does not exist.

        With ``bcs.upstream`` (the tunnel) the read carries the request's own credential and
        impersonation, so the caller's RBAC decides: what they may not read is their 403 (or
        404), exactly as the cluster answers, never something the gateway's credential saw.
        """
        reader = self.engine.cluster_reader
        if reader is None or not attrs.name:
            if required:
                raise BadGateway(
                    "cannot resolve the patch for admission: the cluster cannot be read"
                )
            return None
        upstream = env.get_upstream(environ)
        try:
            if upstream is not None:
                current = reader.get_object_as(upstream, attrs.api_path)
            else:
                current = reader.get_object(cluster_id, attrs.api_path)
        except BCSError:
            raise
        except Exception:
            log.warning("admission: cannot read %s from cluster %s", attrs.api_path, cluster_id,
                        exc_info=True)
            raise BadGateway(
                "cannot read the current object from the cluster for admission"
            ) from None
        if current is None and required:
            raise NotFound(f'{attrs.resource} "{attrs.name}" not found')
        return current


@dataclasses.dataclass(frozen=True)
class _Write:
    """A create or update as the apiserver will perform it."""

    operation: Operation
    #: The object proposed: the body, or (PATCH) the current object patched.
    obj: Any
    #: The current object, read as the caller (PATCH, PUT); ``None`` for a POST or a PUT of none.
    old: Any


def _refuse_unadmittable_media_type(method: str, content_type: str, webhook: str) -> None:
    """Only JSON can be decoded for a webhook: a PATCH as JSON Patch or merge patch, else JSON."""
    if method == "PATCH":
        if content_type not in (_JSON_PATCH, _MERGE_PATCH):
            raise UnsupportedMediaType(
                f'{content_type or "this"} patch cannot be admitted by webhook "{webhook}": '
                f"send a JSON Patch ({_JSON_PATCH}), a merge patch ({_MERGE_PATCH}) "
                "or a full update"
            )
    elif content_type not in ("application/json", ""):
        raise UnsupportedMediaType(
            f'a {content_type} body cannot be admitted by webhook "{webhook}": '
            "send application/json"
        )


def _patched(old: Any, patch: Any, content_type: str) -> Any:
    """The object ``patch`` turns ``old`` into (``patch.go``), keeping ``old``'s resourceVersion."""
    try:
        obj = apply_json_patch(old, patch) if content_type == _JSON_PATCH else apply_merge_patch(old, patch)
    except ValueError as exc:
        raise BCSError(
            f"the patch cannot be applied: {exc}", status=422, code_name="INVALID_PATCH"
        ) from None
    if isinstance(obj, dict) and not _meta(obj).get("resourceVersion"):
        obj.setdefault("metadata", {})["resourceVersion"] = _meta(old).get("resourceVersion")
    return obj


def _forward_admitted(environ: dict[str, Any], method: str, write: _Write, outcome: Outcome) -> None:
    """Replace the request body with what the webhooks admitted."""
    admitted = outcome.object
    if method == "PATCH":
        # Forwarded as a PATCH (the cluster's RBAC checks the "patch" verb the caller
        # used): the change from the object the caller read to the admitted one, applied
        # only if the object is still the one that was admitted.
        environ["CONTENT_TYPE"] = _JSON_PATCH
        replace_body(environ, gojson.dumps(_guarded_patch(write.old, admitted)))
        return
    if method == "PUT" and write.operation == "UPDATE" and not _meta(admitted).get("resourceVersion"):
        # Admitted as an UPDATE: it must not turn into a create if the object is deleted
        # meanwhile (CREATE webhooks never saw it).
        rv = _meta(write.old).get("resourceVersion")
        if rv and isinstance(admitted.get("metadata"), dict):
            admitted = {**admitted, "metadata": {**admitted["metadata"], "resourceVersion": rv}}
            replace_body(environ, gojson.dumps(admitted))
            return
    # What the apiserver gets is the admitted object, re-encoded, never the client's bytes.
    replace_body(environ, outcome.encoding())


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _guarded_patch(old: Any, admitted: Any) -> list[dict[str, Any]]:
    """A JSON Patch from ``old`` to ``admitted`` that applies only to ``old``'s resourceVersion."""
    operations = list(jsonpatch.make_patch(old, admitted).patch)
    rv = _meta(old).get("resourceVersion")
    if isinstance(rv, str) and rv:
        operations.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    return operations


def _mime(environ: Mapping[str, Any]) -> str:
    return str(environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()


def _options(operation: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
    kind = "CreateOptions" if operation == "CREATE" else "UpdateOptions"
    options: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if query.get("dryRun"):
        options["dryRun"] = query["dryRun"]
    if query.get("fieldManager"):
        options["fieldManager"] = query["fieldManager"][0]
    return options
