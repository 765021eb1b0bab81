"""The Kubernetes chain: a cluster's admission webhooks, mutating ones first, then the validating ones.

The webhooks of a cluster's stored configurations (mutating first, by configuration name,
then as listed) whose ``rules`` match the request (:func:`~.matching.webhook_attributes`)
and whose selectors take it (:func:`~.matching.selected`, with the namespace's labels read
through the cluster reader and cached for ``namespace_ttl``) are sent an AdmissionReview in
turn (:meth:`~.calls.WebhookCaller.call_review`); the validating ones see the final object.
A dry run is refused by a webhook with side effects, as the kube-apiserver refuses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.cache import Cache
from ..core.environ import User
from ..core.printable import escape
from .calls import WebhookCaller
from .definitions import K8sWebhook
from .matching import NAMESPACE_NAME_LABEL, Operation, meta, selected, webhook_attributes
from .outcome import AdmissionRejected, AdmissionRun, Outcome
from .review import RequestAttributes
from .store import ClusterReader, DefinitionStore
from .webhook_failure import WebhookCallError

log = logging.getLogger("bcs_middleware.admission")


class KubernetesChain:
    """Runs the Kubernetes webhook configurations of ``store`` (cached until ``store.version()`` moves).

    :param cluster_reader: reads namespace labels (without it, a namespace's labels are just
        ``kubernetes.io/metadata.name``).
    :param total_budget: seconds all webhooks of one request may take together.
    :param namespace_ttl: seconds namespace labels are cached.
    """

    def __init__(self, store: DefinitionStore, caller: WebhookCaller, *, cluster_reader: ClusterReader | None,
                 total_budget: float, namespace_ttl: float, clock: Callable[[], float]) -> None:
        self.store = store
        self.caller = caller
        self.cluster_reader = cluster_reader
        self.total_budget = total_budget
        self._clock = clock
        self._lock = threading.Lock()
        self._k8s: dict[str, tuple[int, tuple[K8sWebhook, ...]]] = {}
        # Failed reads are not cached (the loader raises); answers for namespace_ttl.
        self._ns_labels: Cache[tuple[str, str], dict[str, str]] = Cache(
            max_entries=4096, max_age=max(namespace_ttl, 0), clock=clock)

    def webhooks(self, cluster_id: str) -> tuple[K8sWebhook, ...]:
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

    def matching(
        self, cluster_id: str, operation: str, attrs: RequestAttributes
    ) -> list[K8sWebhook]:
        """Webhooks whose ``rules`` match (selectors are checked later, with the objects)."""
        return [
            w for w in self.webhooks(cluster_id) if webhook_attributes(w, operation, attrs) is not None
        ]

    def admit(
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
            webhooks = self.matching(cluster_id, operation, attrs)
        run = AdmissionRun(obj, self._clock() + self.total_budget, trace, user)
        name = attrs.name or str(meta(obj).get("name") or "")
        for webhook in webhooks:
            try:
                taken = selected(webhook, attrs, run.obj, old_obj,
                                 lambda namespace: self.namespace_labels(cluster_id, namespace))
            except WebhookCallError as err:
                self.caller.failed(run, webhook.name, "kubernetes", webhook.failure_policy, err)
                continue
            if not taken:
                continue
            if dry_run and webhook.side_effects not in ("None", "NoneOnDryRun"):
                raise AdmissionRejected(
                    f'admission webhook "{webhook.name}" does not support dry run',
                    status=400,
                    code_name="DRY_RUN_UNSUPPORTED",
                    steps=run.steps,
                )
            self.caller.call_review(
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

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        return self._ns_labels.load((cluster_id, namespace), self._load_namespace_labels)

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
