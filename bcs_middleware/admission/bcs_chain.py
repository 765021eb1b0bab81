"""The bcs chain: the webhooks of the bcs definition for an operation and a kind, in order.

A definition is chosen by (``Create``/``Update``, the object's kind); each of its webhooks
whose namespace selection takes the object's namespace is called in turn
(:class:`~.calls.WebhookCaller`), each seeing what the one before answered. A bcs-protocol
webhook is sent the object and answers the object to use (:mod:`.answers` checks it does not
move the object); a kubernetes-protocol one is sent an AdmissionReview.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jsonpatch

from ..core.environ import User
from ..core.errors import BadRequest
from ..telemetry import metrics
from .answers import bcs_answer, refuse_bcs_move
from .calls import WebhookCaller
from .definitions import BcsDefinition, BcsWebhook
from .matching import meta
from .outcome import AdmissionRun, Outcome, PatchRefused, Step
from .review import RequestAttributes
from .store import DefinitionStore
from .webhook_failure import WebhookCallError


class BcsChain:
    """Runs the bcs definitions of ``store`` (cached until ``store.version()`` moves).

    :param default_timeout: per-call timeout of webhooks without ``timeoutSeconds``.
    :param total_budget: seconds all webhooks of one request may take together.
    """

    def __init__(self, store: DefinitionStore, caller: WebhookCaller, *, default_timeout: float,
                 total_budget: float, clock: Callable[[], float]) -> None:
        self.store = store
        self.caller = caller
        self.default_timeout = default_timeout
        self.total_budget = total_budget
        self._clock = clock
        self._bcs: tuple[int, dict[tuple[str, str], BcsDefinition]] = (-1, {})
        self._bcs_operations: tuple[int, dict[str, frozenset[str]]] = (-1, {})

    def definitions(self) -> dict[tuple[str, str], BcsDefinition]:
        version = self.store.version()
        cached = self._bcs
        if cached[0] != version:
            cached = (version, {d.key: d for d in self.store.list_bcs()})
            self._bcs = cached
        return cached[1]

    def kinds(self, operation: str) -> frozenset[str]:
        """The (lower-case) kinds some bcs definition covers for ``operation``."""
        version = self.store.version()
        cached = self._bcs_operations
        if cached[0] != version:
            kinds: dict[str, set[str]] = {}
            for op, kind in self.definitions():
                kinds.setdefault(op, set()).add(kind)
            cached = (version, {op: frozenset(k) for op, k in kinds.items()})
            self._bcs_operations = cached
        return cached[1].get(operation, frozenset())

    def admit(
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
        definition = self.definitions().get((operation, obj["kind"].lower()))
        if definition is None:
            return Outcome(obj)
        namespace = str(meta(obj).get("namespace") or "")
        run = AdmissionRun(obj, self._clock() + self.total_budget, trace, user)
        for webhook in definition.webhooks:
            if webhook.selects_namespace(namespace):
                self._run_webhook(run, definition, webhook, operation, user, dry_run, canonical)
        return run.outcome()

    def _run_webhook(
        self,
        run: AdmissionRun,
        definition: BcsDefinition,
        webhook: BcsWebhook,
        operation: str,
        user: User | None,
        dry_run: bool = False,
        canonical: Callable[[Any], Any] | None = None,
    ) -> None:
        label = f"{definition.name}/{webhook.name}"
        if webhook.protocol == "kubernetes":
            self._run_review_webhook(run, label, webhook, operation, user, dry_run)
            return
        before = run.obj
        try:
            data = self.caller.post(
                run,
                label,
                f"bcs/{label}",
                webhook.client,
                webhook.timeout or self.default_timeout,
                [run.encoded()],
            )
            answer = self.caller.checked(f"bcs/{label}", lambda: bcs_answer(data, before))
            if canonical is not None:
                try:
                    answer = canonical(answer)
                except BadRequest as exc:  # the receiver would refuse what the webhook answered
                    raise PatchRefused(f"answered an object the receiver cannot read: {exc.message}",
                                        status=400, code_name="ADMISSION_PATCH_REFUSED") from None
            refuse_bcs_move(before, answer)
        except WebhookCallError as err:
            self.caller.failed(run, label, "bcs", webhook.failure_policy, err)
            return
        except PatchRefused as refused:
            self.caller.refused(run, label, "bcs", refused)
        metrics.WEBHOOK_CALLS.labels(metrics.webhook_label(label), "allowed").inc()
        run.called.append(label)
        changed = answer != before
        run.patched |= changed
        run.obj = answer
        if run.trace:
            patch = tuple(jsonpatch.make_patch(before, answer).patch) if changed else ()
            run.steps.append(Step(label, "bcs", "patched" if changed else "allowed", patch=patch))

    def _run_review_webhook(self, run: AdmissionRun, label: str, webhook: BcsWebhook, operation: str,
                            user: User | None, dry_run: bool) -> None:
        """A bcs webhook of the kubernetes protocol: sent an AdmissionReview of the bcs v4 object."""
        kind = str(run.obj.get("kind"))
        attrs = RequestAttributes(
            group="",
            version="v4",
            resource=f"{kind.lower()}s",
            namespace=str(meta(run.obj).get("namespace") or ""),
        )
        self.caller.call_review(
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
            name=str(meta(run.obj).get("name") or ""),
            old_obj=None,
            user=user,
            dry_run=dry_run,
            options=None,
        )
