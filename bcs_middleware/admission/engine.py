"""The admission engine: which webhooks match a request, calling them in order, the verdict.

Framework-neutral: the WSGI layer (:mod:`bcs_middleware.layers.admission`) and the dry-run
review (:func:`bcs_middleware.admission.dry_run.review`) both drive it. A rejection is raised
as :class:`~.outcome.AdmissionRejected` (a :class:`~bcs_middleware.core.errors.BCSError`, so
it renders itself); otherwise an :class:`~.outcome.Outcome` carries the final object.

:class:`AdmissionEngine` puts the parts together, each a module:

* :mod:`.matching` — which Kubernetes webhooks a request meets (rules, ``matchPolicy``,
  object and namespace selectors);
* :mod:`.calls` — calling one webhook within the request's budget, failure policy,
  denials, metrics; :mod:`.answers` — checking what a webhook changed;
* :mod:`.bcs_chain` and :mod:`.k8s_chain` — the two chains of webhooks;
* :mod:`.outcome` — what an admission produces.

Every call is bounded by the webhook's timeout and by what is left of the request's total
budget. A patch that does not apply to this request's object, or one that would move the
object, fails this request whatever the ``failurePolicy`` — as the kube-apiserver does —
naming the webhook, and does not count towards the webhook's circuit breaker: the object is
the caller's, so counting it would let one user open the breaker for everyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ..core.environ import User
from .bcs_chain import BcsChain
from .calls import WebhookCaller
from .client import WebhookClient
from .definitions import BcsDefinition, K8sWebhook
from .k8s_chain import KubernetesChain
from .matching import Operation as Operation  # the layer's vocabulary, with the engine's
from .outcome import Outcome as Outcome
from .outcome import warning_headers as warning_headers
from .review import RequestAttributes
from .store import ClusterReader, DefinitionStore


class AdmissionEngine:
    """Match requests against the stored definitions and run the webhook chains.

    :param store: where definitions are read (cached until ``store.version()`` moves).
    :param cluster_reader: reads namespace labels and current objects of a cluster
        (Kubernetes definitions only); without it, namespace labels are just
        ``kubernetes.io/metadata.name`` and no old object is sent.
    :param client: the :class:`~.client.WebhookClient` (pools, TLS, circuit breaker).
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
        caller = WebhookCaller(client, total_budget=total_budget, clock=clock)
        self._bcs = BcsChain(store, caller, default_timeout=default_timeout, total_budget=total_budget, clock=clock)
        self._k8s = KubernetesChain(store, caller, cluster_reader=cluster_reader, total_budget=total_budget,
                                    namespace_ttl=namespace_ttl, clock=clock)

    # -- bcs definitions ---------------------------------------------------------------

    def bcs_definitions(self) -> dict[tuple[str, str], BcsDefinition]:
        return self._bcs.definitions()

    def bcs_kinds(self, operation: str) -> frozenset[str]:
        """The (lower-case) kinds some bcs definition covers for ``operation``."""
        return self._bcs.kinds(operation)

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
        """Run the bcs definition matching (``operation``, ``obj["kind"]``), if any (:meth:`.BcsChain.admit`)."""
        return self._bcs.admit(operation, obj, user, dry_run=dry_run, trace=trace, canonical=canonical)

    # -- Kubernetes definitions ---------------------------------------------------------

    def k8s_webhooks(self, cluster_id: str) -> tuple[K8sWebhook, ...]:
        """Every webhook of the cluster: mutating first, by configuration name, then as listed."""
        return self._k8s.webhooks(cluster_id)

    def k8s_matching(self, cluster_id: str, operation: str, attrs: RequestAttributes) -> list[K8sWebhook]:
        """Webhooks whose ``rules`` match (selectors are checked later, with the objects)."""
        return self._k8s.matching(cluster_id, operation, attrs)

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
        return self._k8s.admit(cluster_id, operation, attrs, obj, old_obj, user, dry_run=dry_run,
                               options=options, webhooks=webhooks, trace=trace)

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        return self._k8s.namespace_labels(cluster_id, namespace)
