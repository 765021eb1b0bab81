"""Calling one webhook and checking its answer, within the request's admission budget.

:class:`WebhookCaller` sends a bcs webhook its object (:meth:`~WebhookCaller.post`) or a
Kubernetes webhook an AdmissionReview (:meth:`~WebhookCaller.call_review`), through the
:class:`~.client.WebhookClient` (pools, TLS, circuit breaker), bounded by the webhook's
timeout and by what is left of the request's total budget. An unusable answer counts
against the webhook's breaker as a failed call does (:meth:`~WebhookCaller.checked`).

Failure semantics follow the kube-apiserver (:meth:`~WebhookCaller.failed`): with
``failurePolicy: Ignore`` a webhook that cannot be called or answers badly is skipped and
logged; with ``Fail`` the request is rejected with ``500 InternalError`` and the message
``failed calling webhook "<name>": <cause>`` — the cause for superusers only: any other
caller reads :data:`~.client.PUBLIC_FAILURE` whatever failed, and an authenticated one gets
the failure no sooner than the call's timeout (a webhook's address is chosen by whoever
defined it, and must not make the gateway a port scanner; see :mod:`.client`). A denial
carries the webhook's ``status.code`` (403 when it gives none) and message. A change that
does not apply or moves the object (:mod:`.answers`) fails the request whatever the policy
and does not count towards the breaker (:meth:`~WebhookCaller.refused`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, NoReturn

from ..core import gojson
from ..core.environ import User
from ..core.printable import escape
from ..telemetry import metrics
from .answers import patched_object
from .client import PUBLIC_FAILURE, WebhookClient
from .definitions import ClientConfig
from .matching import in_version
from .outcome import AdmissionRejected, AdmissionRun, PatchRefused, Step, warning_headers
from .review import RequestAttributes, ReviewResponse, build_review, kind_of, parse_review_response
from .webhook_failure import WebhookCallError

log = logging.getLogger("bcs_middleware.admission")


class WebhookCaller:
    """Calls webhooks for the chains (see the module docstring).

    :param client: the :class:`~.client.WebhookClient`.
    :param total_budget: seconds all webhooks of one request may take together (only named here:
        each run carries its own deadline).
    """

    def __init__(self, client: WebhookClient, *, total_budget: float, clock: Callable[[], float]) -> None:
        self.client = client
        self.total_budget = total_budget
        self._clock = clock

    def post(
        self,
        run: AdmissionRun,
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

    def checked(self, breaker_key: str, check: Callable[[], Any]) -> Any:
        # Answers that arrive but are unusable count against the breaker too.
        try:
            result = check()
        except WebhookCallError:
            self.client.breaker.failure(breaker_key)
            raise
        self.client.breaker.success(breaker_key)
        return result

    def refused(
        self, run: AdmissionRun, label: str, protocol: Literal["bcs", "kubernetes"], refused: PatchRefused
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

    def failed(
        self,
        run: AdmissionRun,
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

    def call_review(
        self,
        run: AdmissionRun,
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
        """Send ``run``'s object to a Kubernetes webhook in an AdmissionReview and act on the answer:
        a failure per ``policy``, a denial (:class:`AdmissionRejected`), or the patched object."""
        uid = str(uuid.uuid4())
        asked = request_attrs or attrs
        # matchPolicy Equivalent: the webhook gets the object in its rule's version.
        sent = in_version(run.obj, attrs) if asked is not attrs else run.obj
        sent_old = in_version(old_obj, attrs) if asked is not attrs else old_obj
        chunks = _review_chunks(run, sent, sent_old, version=version, uid=uid, operation=operation, attrs=attrs,
                                asked=asked, name=name, user=user, old_obj=old_obj, dry_run=dry_run, options=options)
        try:
            data = self.post(run, label, breaker_key, client, timeout, chunks)
            del chunks

            response = self.checked(
                breaker_key,
                lambda: parse_review_response(data, version=version, uid=uid, mutating=mutating),
            )
            patched = run.obj
            if response.allowed and response.patch:
                patched = patched_object(sent, response.patch, attrs)
                if sent is not run.obj and isinstance(run.obj, dict) and "apiVersion" in run.obj:
                    patched["apiVersion"] = run.obj["apiVersion"]  # back to the request's version
        except WebhookCallError as err:
            self.failed(run, label, "kubernetes", policy, err)
            return
        except PatchRefused as refused:
            self.refused(run, label, "kubernetes", refused)
        self._record(run, label, response, patched)

    def _record(self, run: AdmissionRun, label: str, response: ReviewResponse, patched: Any) -> None:
        """A webhook answered: note its warnings and annotations; raise its denial, or take its patch."""
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


def _review_chunks(run: AdmissionRun, sent: Any, sent_old: Any, *, version: str, uid: str, operation: str,
                   attrs: RequestAttributes, asked: RequestAttributes, name: str, user: User | None,
                   old_obj: Any, dry_run: bool, options: Mapping[str, Any] | None) -> list[bytes]:
    """The AdmissionReview's bytes; the object, when sent as it is, by its one encoding."""
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
    return chunks
