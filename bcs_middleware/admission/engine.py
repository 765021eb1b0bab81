"""The admission engine: which webhooks match a request, calling them in order, the verdict.

Framework-neutral: the WSGI layer (:mod:`bcs_middleware.layers.admission`) and
the dry-run endpoint (:func:`review`) both drive it. A rejection is raised as
:class:`AdmissionRejected` (a :class:`~bcs_middleware.core.errors.BCSError`, so it renders
itself); otherwise an :class:`Outcome` carries the final object.

Failure semantics follow the kube-apiserver: with ``failurePolicy: Ignore`` a
webhook that cannot be called or answers badly is skipped and logged; with
``Fail`` the request is rejected with ``500 InternalError`` and the message
``failed calling webhook "<name>": <cause>`` — the cause for superusers only: any
other caller reads :data:`~.client.PUBLIC_FAILURE` whatever failed, and an
authenticated one gets the failure no sooner than the call's timeout (a webhook's
address is chosen by whoever defined it, and must not make the gateway a port
scanner; see :mod:`.client`). A denial carries the webhook's
``status.code`` (403 when it gives none) and message. Every call is bounded by
the webhook's timeout and by what is left of the request's total budget.

A patch that does not apply to this request's object, or one that would move the
object (change its ``apiVersion``, ``kind``, ``metadata.name`` or
``metadata.namespace``; for bcs webhooks its kind, name or namespace), fails this
request whatever the ``failurePolicy`` — as the kube-apiserver does — naming the
webhook, and does not count towards the webhook's circuit breaker: the object is
the caller's, so counting it would let one user open the breaker for everyone.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import jsonpatch

from ..core import gojson
from ..core.bodies import parse_json
from ..core.environ import AdmissionResult, User
from ..core.errors import BadRequest, BcsCode, BCSError, ValidationError
from ..core.lru import LoadingCache
from ..core.printable import escape
from ..telemetry import metrics
from .client import PUBLIC_FAILURE, WebhookCallError, WebhookClient
from .definitions import BcsDefinition, BcsWebhook, ClientConfig, K8sWebhook
from .equivalence import convertible, equivalents
from .review import (
    RequestAttributes,
    apply_json_patch,
    build_review,
    kind_of,
    parse_review_response,
)
from .store import ClusterReader, DefinitionStore

log = logging.getLogger("bcs_middleware.admission")

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: The admission operations of Kubernetes webhooks (``admissionregistration.k8s.io/v1`` rules).
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _PatchRefused(Exception):
    """A webhook's change cannot be used for this request's object (not the webhook's fault)."""

    def __init__(self, detail: str, *, status: int, code_name: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code_name = code_name


class AdmissionRejected(BCSError):
    """The request may not go on: a webhook denied it, or failed under ``failurePolicy: Fail``."""

    status = 403
    code_name = "ADMISSION_DENIED"
    # The source's driver answers every admission failure as a filter failure: 400, 1405234.
    bcs_status = 400
    bcs_code = BcsCode.MESOS_DRIVER_HTTP_FILTER_FAILED

    def __init__(self, message: str, *, steps: Sequence[Step] = (), **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.steps = tuple(steps)


@dataclass(frozen=True)
class Step:
    """What one matching webhook did (for logs and the dry-run review)."""

    webhook: str
    protocol: Literal["bcs", "kubernetes"]
    outcome: Literal["allowed", "patched", "denied", "skipped", "failed"]
    cause: str = ""
    detail: str = ""
    patch: tuple[dict[str, Any], ...] | None = None
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "webhook": self.webhook,
            "protocol": self.protocol,
            "outcome": self.outcome,
        }
        if self.cause:
            data["cause"], data["detail"] = self.cause, self.detail
        if self.patch is not None:
            data["patch"] = list(self.patch)
        if self.warnings:
            data["warnings"] = list(self.warnings)
        return data


@dataclass(frozen=True)
class Outcome:
    """The admitted object and what happened on the way."""

    object: Any
    patched: bool = False
    webhooks: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    audit_annotations: tuple[tuple[str, str], ...] = ()
    steps: tuple[Step, ...] = field(default=(), repr=False)
    #: ``object``'s :func:`~bcs_middleware.core.gojson.dumps` when already made (else ``None``).
    encoded: bytes | None = field(default=None, repr=False)

    def encoding(self) -> bytes:
        """What the upstream is sent: ``object`` encoded once."""
        return self.encoded if self.encoded is not None else gojson.dumps(self.object)

    def result(self) -> AdmissionResult:
        return AdmissionResult(
            webhooks=self.webhooks,
            patched=self.patched,
            warnings=self.warnings,
            audit_annotations=self.audit_annotations,
        )


class _Run:
    """Mutable state of one admission: the object so far, the deadline, what was done."""

    def __init__(self, obj: Any, deadline: float, trace: bool, user: User | None = None) -> None:
        self._obj = obj
        self._encoded: bytes | None = None
        self.deadline = deadline
        self.trace = trace
        # Why a call failed is told to superusers only; an authenticated caller who is not
        # one waits out a failed call's timeout (see the module docstring).
        self.detailed = user is not None and user.is_superuser
        self.uniform = user is not None and not user.is_superuser
        self.patched = False
        self.called: list[str] = []
        self.warnings: list[str] = []
        self.annotations: list[tuple[str, str]] = []
        self.steps: list[Step] = []

    @property
    def obj(self) -> Any:
        return self._obj

    @obj.setter
    def obj(self, value: Any) -> None:
        if value is not self._obj:
            self._obj, self._encoded = value, None

    def encoded(self) -> bytes:
        """The object's one encoding (:func:`~bcs_middleware.core.gojson.dumps`), made once per version:
        what every webhook is sent and what goes upstream."""
        if self._encoded is None:
            self._encoded = gojson.dumps(self._obj)
        return self._encoded

    def outcome(self) -> Outcome:
        return Outcome(
            self.obj,
            self.patched,
            tuple(self.called),
            tuple(self.warnings),
            tuple(self.annotations),
            tuple(self.steps),
            encoded=self._encoded,
        )


class AdmissionEngine:
    """Match requests against the stored definitions and run the webhook chains.

    :param store: where definitions are read (cached until ``store.version()`` moves).
    :param cluster_reader: reads namespace labels and current objects of a cluster
        (Kubernetes definitions only); without it, namespace labels are just
        ``kubernetes.io/metadata.name`` and no old object is sent.
    :param client: the :class:`WebhookClient` (pools, TLS, circuit breaker).
    :param total_budget: seconds all webhooks of one request may take together.
    :param default_timeout: per-call timeout of bcs webhooks without ``timeoutSeconds``.
    :param namespace_ttl: seconds namespace labels are cached.
    """

    def __init__(
        self,
        store: DefinitionStore,
        *,
        client: WebhookClient,
        cluster_reader: ClusterReader | None = None,
        total_budget: float = 15.0,
        default_timeout: float = 10.0,
        namespace_ttl: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.client = client
        self.cluster_reader = cluster_reader
        self.total_budget = total_budget
        self.default_timeout = default_timeout
        self.namespace_ttl = namespace_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._bcs: tuple[int, dict[tuple[str, str], BcsDefinition]] = (-1, {})
        self._bcs_operations: tuple[int, dict[str, frozenset[str]]] = (-1, {})
        self._k8s: dict[str, tuple[int, tuple[K8sWebhook, ...]]] = {}
        # Failed reads are not cached (the loader raises); answers for namespace_ttl.
        self._ns_labels: LoadingCache[tuple[str, str], dict[str, str]] = LoadingCache(
            ttl=namespace_ttl, max_entries=4096, clock=clock)

    # -- bcs definitions ---------------------------------------------------------------

    def bcs_definitions(self) -> dict[tuple[str, str], BcsDefinition]:
        version = self.store.version()
        cached = self._bcs
        if cached[0] != version:
            cached = (version, {d.key: d for d in self.store.list_bcs()})
            self._bcs = cached
        return cached[1]

    def bcs_kinds(self, operation: str) -> frozenset[str]:
        """The (lower-case) kinds some bcs definition covers for ``operation``."""
        version = self.store.version()
        cached = self._bcs_operations
        if cached[0] != version:
            kinds: dict[str, set[str]] = {}
            for op, kind in self.bcs_definitions():
                kinds.setdefault(op, set()).add(kind)
            cached = (version, {op: frozenset(k) for op, k in kinds.items()})
            self._bcs_operations = cached
        return cached[1].get(operation, frozenset())

    def admit_bcs(
        self,
        operation: Literal["Create", "Update"],
        obj: Any,
        user: User | None,
        *,
        dry_run: bool = False,
        trace: bool = False,
        canonical: Callable[[Any], Any] | None = None,
    ) -> Outcome:
        """Run the definition matching (``operation``, ``obj["kind"]``), if any.

        ``canonical`` reads each webhook's answer as the receiver reads the request
        body (keys in their tags' spelling, for the bcs services): the next webhook and
        the upstream then see what the receiver will act on, and the kind, name and
        namespace compared are the ones it will read.
        """
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            return Outcome(obj)
        definition = self.bcs_definitions().get((operation, obj["kind"].lower()))
        if definition is None:
            return Outcome(obj)
        namespace = str(_meta(obj).get("namespace") or "")
        run = _Run(obj, self._clock() + self.total_budget, trace, user)
        for webhook in definition.webhooks:
            if webhook.selects_namespace(namespace):
                self._run_bcs_webhook(run, definition, webhook, operation, user, dry_run, canonical)
        return run.outcome()

    def _run_bcs_webhook(
        self,
        run: _Run,
        definition: BcsDefinition,
        webhook: BcsWebhook,
        operation: str,
        user: User | None,
        dry_run: bool = False,
        canonical: Callable[[Any], Any] | None = None,
    ) -> None:
        label = f"{definition.name}/{webhook.name}"
        if webhook.protocol == "kubernetes":
            kind = str(run.obj.get("kind"))
            attrs = RequestAttributes(
                group="",
                version="v4",
                resource=f"{kind.lower()}s",
                namespace=str(_meta(run.obj).get("namespace") or ""),
            )
            self._call_review(
                run,
                label,
                f"bcs/{label}",
                webhook.client,
                webhook.failure_policy,
                webhook.timeout or self.default_timeout,
                mutating=True,
                version=next(v for v in webhook.review_versions if v in ("v1", "v1beta1")),
                operation=operation.upper(),
                attrs=attrs,
                name=str(_meta(run.obj).get("name") or ""),
                old_obj=None,
                user=user,
                dry_run=dry_run,
                options=None,
            )
            return
        before = run.obj
        try:
            data = self._post(
                run,
                label,
                f"bcs/{label}",
                webhook.client,
                webhook.timeout or self.default_timeout,
                [run.encoded()],
            )
            answer = self._checked(f"bcs/{label}", lambda: _bcs_answer(data, before))
            if canonical is not None:
                try:
                    answer = canonical(answer)
                except BadRequest as exc:  # the receiver would refuse what the webhook answered
                    raise _PatchRefused(f"answered an object the receiver cannot read: {exc.message}",
                                        status=400, code_name="ADMISSION_PATCH_REFUSED") from None
            _refuse_bcs_move(before, answer)
        except WebhookCallError as err:
            self._failed(run, label, "bcs", webhook.failure_policy, err)
            return
        except _PatchRefused as refused:
            self._refused(run, label, "bcs", refused)
        metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "allowed").inc()
        run.called.append(label)
        changed = answer != before
        run.patched |= changed
        run.obj = answer
        if run.trace:
            patch = tuple(jsonpatch.make_patch(before, answer).patch) if changed else ()
            run.steps.append(Step(label, "bcs", "patched" if changed else "allowed", patch=patch))

    # -- Kubernetes definitions ---------------------------------------------------------

    def k8s_webhooks(self, cluster_id: str) -> tuple[K8sWebhook, ...]:
        """Every webhook of the cluster: mutating first, by configuration name, then as listed."""
        version = self.store.version()
        cached = self._k8s.get(cluster_id)
        if cached is None or cached[0] != version:
            configurations = sorted(
                self.store.list_k8s(cluster_id), key=lambda c: (not c.mutating, c.name)
            )
            cached = (version, tuple(w for c in configurations for w in c.webhooks))
            with self._lock:
                self._k8s[cluster_id] = cached
        return cached[1]

    def k8s_matching(
        self, cluster_id: str, operation: str, attrs: RequestAttributes
    ) -> list[K8sWebhook]:
        """Webhooks whose ``rules`` match (selectors are checked later, with the objects)."""
        return [
            w for w in self.k8s_webhooks(cluster_id) if webhook_attributes(w, operation, attrs) is not None
        ]

    def admit_k8s(
        self,
        cluster_id: str,
        operation: Operation,
        attrs: RequestAttributes,
        obj: Any,
        old_obj: Any,
        user: User | None,
        *,
        dry_run: bool = False,
        options: Mapping[str, Any] | None = None,
        webhooks: Sequence[K8sWebhook] | None = None,
        trace: bool = False,
    ) -> Outcome:
        """Run the matching mutating webhooks, then the validating ones on the final object."""
        if webhooks is None:
            webhooks = self.k8s_matching(cluster_id, operation, attrs)
        run = _Run(obj, self._clock() + self.total_budget, trace, user)
        name = attrs.name or str(_meta(obj).get("name") or "")
        for webhook in webhooks:
            try:
                selected = self._selected(cluster_id, webhook, attrs, run.obj, old_obj)
            except WebhookCallError as err:
                self._failed(run, webhook.name, "kubernetes", webhook.failure_policy, err)
                continue
            if not selected:
                continue
            if dry_run and webhook.side_effects not in ("None", "NoneOnDryRun"):
                raise AdmissionRejected(
                    f'admission webhook "{webhook.name}" does not support dry run',
                    status=400,
                    code_name="DRY_RUN_UNSUPPORTED",
                    steps=run.steps,
                )
            self._call_review(
                run,
                webhook.name,
                f"{cluster_id}/{webhook.configuration}/{webhook.name}",
                webhook.client,
                webhook.failure_policy,
                webhook.timeout,
                mutating=webhook.mutating,
                version=webhook.review_version,
                operation=operation,
                attrs=webhook_attributes(webhook, operation, attrs) or attrs,
                name=name,
                old_obj=old_obj,
                user=user,
                dry_run=dry_run,
                options=options,
                request_attrs=attrs,
            )
        return run.outcome()

    def _selected(
        self, cluster_id: str, webhook: K8sWebhook, attrs: RequestAttributes, obj: Any, old_obj: Any
    ) -> bool:
        selector = webhook.object_selector
        # The apiserver's object matcher: an object without metadata (the options of a
        # CONNECT) matches no objectSelector, not even one that empty labels would satisfy.
        if not selector.is_empty and not any(
            isinstance(o, dict) and isinstance(o.get("metadata"), dict) and selector.matches(_labels(o))
            for o in (obj, old_obj)
        ):
            return False
        selector = webhook.namespace_selector
        if selector.is_empty:
            return True
        if attrs.resource == "namespaces":
            source = obj if obj is not None else old_obj
            labels = {
                **_labels(source),
                NAMESPACE_NAME_LABEL: attrs.name or str(_meta(source).get("name") or ""),
            }
            return selector.matches(labels)
        if not attrs.namespaced:
            return (
                True  # cluster-scoped objects are not in a namespace: the selector does not apply
            )
        return selector.matches(self.namespace_labels(cluster_id, attrs.namespace))

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        return self._ns_labels.get((cluster_id, namespace), self._load_namespace_labels)

    def _load_namespace_labels(self, key: tuple[str, str]) -> dict[str, str]:
        cluster_id, namespace = key
        labels: dict[str, str] = {}
        if self.cluster_reader is not None:
            try:
                labels = dict(self.cluster_reader.namespace_labels(cluster_id, namespace) or {})
            except Exception:
                log.warning(
                    "admission: cannot read labels of namespace %s in cluster %s",
                    escape(namespace),
                    cluster_id,
                    exc_info=True,
                )
                raise WebhookCallError(
                    "namespace", f"cannot read labels of namespace {namespace!r}"
                ) from None
        labels[NAMESPACE_NAME_LABEL] = namespace
        return labels

    # -- calling --------------------------------------------------------------------

    def _call_review(
        self,
        run: _Run,
        label: str,
        breaker_key: str,
        client: ClientConfig,
        policy: str,
        timeout: float,
        *,
        mutating: bool,
        version: str,
        operation: str,
        attrs: RequestAttributes,
        name: str,
        old_obj: Any,
        user: User | None,
        dry_run: bool,
        options: Mapping[str, Any] | None,
        request_attrs: RequestAttributes | None = None,
    ) -> None:
        uid = str(uuid.uuid4())
        asked = request_attrs or attrs
        # matchPolicy Equivalent: the webhook gets the object in its rule's version.
        sent = _in_version(run.obj, attrs) if asked is not attrs else run.obj
        sent_old = _in_version(old_obj, attrs) if asked is not attrs else old_obj
        body = build_review(
            version=version,
            uid=uid,
            operation=operation,
            attrs=attrs,
            # A DELETE's kind is the deleted object's (its review has no object).
            kind=kind_of(sent if sent is not None else sent_old, attrs),
            name=name,
            user=user,
            obj=sent,
            old_obj=sent_old,
            dry_run=dry_run,
            options=options,
            request_attrs=asked,
            request_kind=kind_of(run.obj if run.obj is not None else old_obj, asked),
        )
        if sent is run.obj:  # the object's one encoding, by reference inside the review
            placeholder = f"\x00{uuid.uuid4().hex}\x00"
            body["request"]["object"] = placeholder
            chunks = gojson.dumps_around(body, placeholder, run.encoded())
        else:
            chunks = [gojson.dumps(body)]
        del body
        try:
            data = self._post(run, label, breaker_key, client, timeout, chunks)
            del chunks

            response = self._checked(
                breaker_key,
                lambda: parse_review_response(data, version=version, uid=uid, mutating=mutating),
            )
            patched = run.obj
            if response.allowed and response.patch:
                patched = _patched(sent, response.patch, attrs)
                if sent is not run.obj and isinstance(run.obj, dict) and "apiVersion" in run.obj:
                    patched["apiVersion"] = run.obj["apiVersion"]  # back to the request's version
        except WebhookCallError as err:
            self._failed(run, label, "kubernetes", policy, err)
            return
        except _PatchRefused as refused:
            self._refused(run, label, "kubernetes", refused)
        run.called.append(label)
        run.warnings.extend(response.warnings)
        run.annotations.extend((f"{label}/{k}", v) for k, v in response.audit_annotations)
        if not response.allowed:
            metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "denied").inc()
            status = response.status
            code = status.get("code") if isinstance(status.get("code"), int) else 403
            code = max(int(code), 400) if code else 403
            reason = status.get("message") or status.get("reason")
            message = f'admission webhook "{label}" denied the request'
            message = f"{message}: {reason}" if reason else f"{message} without explanation"
            run.steps.append(
                Step(
                    label,
                    "kubernetes",
                    "denied",
                    detail=str(reason or ""),
                    warnings=response.warnings,
                )
            )
            raise AdmissionRejected(
                message,
                status=min(code, 599),
                steps=run.steps,
                headers=warning_headers(run.warnings),
            )
        metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "allowed").inc()
        changed = response.patch is not None and patched != run.obj
        run.patched |= changed
        run.obj = patched
        if run.trace:
            run.steps.append(
                Step(
                    label,
                    "kubernetes",
                    "patched" if changed else "allowed",
                    patch=response.patch,
                    warnings=response.warnings,
                )
            )

    def _post(
        self,
        run: _Run,
        label: str,
        breaker_key: str,
        client: ClientConfig,
        timeout: float,
        body: list[bytes],
    ) -> bytes:
        remaining = run.deadline - self._clock()
        if remaining <= 0:
            raise WebhookCallError(
                "budget", f"total admission budget of {self.total_budget:g}s spent"
            )
        started = time.perf_counter()
        try:
            return self.client.post(
                self.client.target(client), body, min(timeout, remaining), breaker_key=breaker_key,
                full_timeout=timeout <= remaining, uniform=run.uniform,
            )
        finally:
            metrics.WEBHOOK_LATENCY.labels(metrics.webhook_label(label)).observe(time.perf_counter() - started)

    def _checked(self, breaker_key: str, check: Callable[[], Any]) -> Any:
        # Answers that arrive but are unusable count against the breaker too.
        try:
            result = check()
        except WebhookCallError:
            self.client.breaker.failure(breaker_key)
            raise
        self.client.breaker.success(breaker_key)
        return result

    def _refused(
        self, run: _Run, label: str, protocol: Literal["bcs", "kubernetes"], refused: _PatchRefused
    ) -> NoReturn:
        metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "error").inc()
        log.warning("admission webhook %s: change refused: %s", label, escape(refused.detail))
        run.steps.append(Step(label, protocol, "failed", "patch", refused.detail))
        raise AdmissionRejected(
            f'admission webhook "{label}" {refused.detail}',
            status=refused.status,
            code_name=refused.code_name,
            steps=run.steps,
        )

    def _failed(
        self,
        run: _Run,
        label: str,
        protocol: Literal["bcs", "kubernetes"],
        policy: str,
        err: WebhookCallError,
    ) -> None:
        metrics.WEBHOOK_FAILURES.labels(metrics.webhook_label(label), err.cause).inc()
        metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "error").inc()
        if policy == "Ignore":
            log.warning(
                "admission webhook %s skipped (failurePolicy Ignore): %s: %s",
                label,
                err.cause,
                escape(err.detail),
            )
            run.steps.append(Step(label, protocol, "skipped", err.cause, err.detail))
            return
        log.warning(
            "admission webhook %s failed (failurePolicy Fail): %s: %s", label, err.cause, escape(err.detail)
        )
        run.steps.append(Step(label, protocol, "failed", err.cause, err.detail))
        raise AdmissionRejected(
            f'failed calling webhook "{label}": {err.detail if run.detailed else PUBLIC_FAILURE}',
            status=500,
            code_name="ADMISSION_WEBHOOK_FAILED",
            steps=run.steps,
        )


def _bcs_answer(data: bytes, before: Mapping[str, Any]) -> dict[str, Any]:
    try:
        answer = parse_json(data, what="answer")
    except BadRequest as exc:
        raise WebhookCallError("malformed", exc.message) from None
    if not isinstance(answer, dict):
        raise WebhookCallError("malformed", "answer is not a JSON object")
    return answer


def _refuse_bcs_move(before: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
    if str(answer.get("kind", "")).lower() != str(before.get("kind", "")).lower():
        raise _PatchRefused("may not change the object's kind", status=400,
                            code_name="ADMISSION_PATCH_REFUSED")
    for key in ("name", "namespace"):
        if _meta(answer).get(key) != _meta(before).get(key):
            raise _PatchRefused(f"may not change metadata.{key}", status=400,
                                code_name="ADMISSION_PATCH_REFUSED")


def _patched(obj: Any, patch: Sequence[Mapping[str, Any]], attrs: RequestAttributes) -> dict[str, Any]:
    """``obj`` with a webhook's patch applied; :class:`_PatchRefused` if it does not apply or moves it."""
    if obj is None:
        # A DELETE has no object to patch (handlers' mutating dispatcher answers the same).
        raise _PatchRefused("attempted to modify the object, which is not supported for this operation",
                            status=500, code_name="ADMISSION_PATCH_FAILED")
    try:
        patched = apply_json_patch(obj, patch)
    except ValueError as exc:
        raise _PatchRefused(f"returned a patch that does not apply to the object: {exc}",
                            status=500, code_name="ADMISSION_PATCH_FAILED") from None
    if not isinstance(patched, dict):
        raise _PatchRefused("returned a patch that makes the object something not a JSON object",
                            status=500, code_name="ADMISSION_PATCH_FAILED")
    # The object a request names may not be moved by a webhook (the kube-apiserver refuses
    # that too): another kind, name or namespace would escape what was authorized and matched.
    for where, before, after in (
        ("apiVersion", obj.get("apiVersion"), patched.get("apiVersion")),
        ("kind", obj.get("kind"), patched.get("kind")),
        ("metadata.name", _meta(obj).get("name") or attrs.name, _meta(patched).get("name") or attrs.name),
        ("metadata.namespace", _meta(obj).get("namespace") or attrs.namespace,
         _meta(patched).get("namespace") or attrs.namespace),
    ):
        if before != after:
            raise _PatchRefused(f"may not change {where}", status=400, code_name="ADMISSION_PATCH_REFUSED")
    return patched


def webhook_attributes(webhook: K8sWebhook, operation: str, attrs: RequestAttributes) -> RequestAttributes | None:
    """The request as ``webhook`` is sent it (its rule's group/version), ``None`` if no rule matches.

    ``matchPolicy: Exact`` matches the request's own group/version only; ``Equivalent``
    (the default) also an equivalent one (:mod:`.equivalence`): a built-in equivalent is
    sent converted to the rule's version, another version of the request's own group
    (custom resources) is sent as the request was made.
    """

    def hit(group: str, version: str) -> bool:
        return any(
            r.matches(operation, group, version, attrs.resource, attrs.subresource, attrs.namespaced)
            for r in webhook.rules
        )

    if hit(attrs.group, attrs.version):
        return attrs
    if webhook.match_policy != "Equivalent":
        return None
    for group, version in equivalents(attrs.group, attrs.version, attrs.resource):
        if hit(group, version):
            return dataclasses.replace(attrs, group=group, version=version)
    if any(hit(attrs.group, version) for rule in webhook.rules for version in rule.api_versions):
        return attrs
    return None


def _in_version(obj: Any, attrs: RequestAttributes) -> Any:
    if not isinstance(obj, dict) or "apiVersion" not in obj:
        return obj
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    if not convertible(attrs.resource, group, version, attrs.group, attrs.version):
        return obj
    return {**obj, "apiVersion": f"{attrs.group}/{attrs.version}" if attrs.group else attrs.version}


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _labels(obj: Any) -> dict[str, str]:
    labels = _meta(obj).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def warning_headers(warnings: Sequence[str], limit: int = 32) -> list[tuple[str, str]]:
    """RFC 7234 ``Warning: 299 - "text"`` headers, as the apiserver sends them."""
    headers = []
    for text in list(dict.fromkeys(warnings))[:limit]:
        clean = "".join(c if c.isprintable() else " " for c in text)[:1024]
        clean = clean.replace("\\", "\\\\").replace('"', '\\"')
        headers.append(("Warning", f'299 - "{clean}"'))
    return headers


def review(engine: AdmissionEngine, document: Any, user: User | None) -> dict[str, Any]:
    """Dry-run admission of ``document``; nothing is forwarded anywhere.

    ``{"operation": "CREATE"|"UPDATE"|"Create"|"Update", "object": {...},
    "oldObject"?, "cluster_id"? (Kubernetes definitions), "resource"?
    ("pods" or {"group","version","resource"}), "subResource"?, "namespace"?, "name"?,
    }`` → which webhooks ran, what each did, warnings, the final object,
    and whether the request would be allowed.

    A review is always a dry run: webhooks receive ``dryRun: true`` and, as
    kube-apiserver does, a webhook whose ``sideEffects`` is neither ``None`` nor
    ``NoneOnDryRun`` is never called — the review answers that it does not support
    dry run instead.
    """
    if not isinstance(document, dict):
        raise ValidationError("(body): must be a JSON object")
    operation = str(document.get("operation", "")).upper()
    if operation not in ("CREATE", "UPDATE"):
        raise ValidationError("operation: must be CREATE or UPDATE")
    obj = document.get("object")
    if not isinstance(obj, dict):
        raise ValidationError("object: must be a JSON object")
    cluster_id = document.get("cluster_id")
    try:
        if cluster_id is None:
            outcome = engine.admit_bcs(
                "Create" if operation == "CREATE" else "Update",
                obj,
                user,
                dry_run=True,
                trace=True,
            )
        else:
            attrs = _review_attributes(document, obj)
            outcome = engine.admit_k8s(
                str(cluster_id),
                "CREATE" if operation == "CREATE" else "UPDATE",
                attrs,
                obj,
                document.get("oldObject"),
                user,
                dry_run=True,
                trace=True,
            )
    except AdmissionRejected as rejected:
        return {
            "allowed": False,
            "status": {"code": rejected.status, "message": rejected.message},
            "webhooks": [_step_for(s, user) for s in rejected.steps],
            "final_object": None,
        }
    return {
        "allowed": True,
        "webhooks": [_step_for(s, user) for s in outcome.steps],
        "patched": outcome.patched,
        "warnings": list(outcome.warnings),
        "audit_annotations": dict(outcome.audit_annotations),
        "final_object": outcome.object,
    }


def _step_for(step: Step, user: User | None) -> dict[str, Any]:
    """A step as ``user`` may read it: why a call failed is for superusers (see :mod:`.client`)."""
    data = step.as_dict()
    if (step.outcome in ("skipped", "failed") and step.cause != "patch"
            and not (user is not None and user.is_superuser)):
        data["cause"], data["detail"] = "failed", PUBLIC_FAILURE
    return data


def _review_attributes(document: Mapping[str, Any], obj: Mapping[str, Any]) -> RequestAttributes:
    resource = document.get("resource")
    api_version = str(obj.get("apiVersion") or "v1")
    group, _, version = api_version.rpartition("/")
    if isinstance(resource, dict):
        group = str(resource.get("group", group))
        version = str(resource.get("version", version))
        resource = resource.get("resource")
    if not isinstance(resource, str) or not resource:
        raise ValidationError('resource: required for Kubernetes definitions (e.g. "pods")')
    namespace = document.get("namespace", _meta(obj).get("namespace") or "")
    return RequestAttributes(
        group=group,
        version=version,
        resource=resource,
        subresource=str(document.get("subResource") or ""),
        name=str(document.get("name") or _meta(obj).get("name") or ""),
        namespace=str(namespace),
    )
