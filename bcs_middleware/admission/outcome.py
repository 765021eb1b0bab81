"""What an admission produces: the admitted object and its steps, or the rejection.

Pure values shared by the engine's parts (:mod:`.engine`) and read by the WSGI layer and
the dry-run review: :class:`Outcome`, :class:`Step`, :class:`AdmissionRejected`, and the
state of one run of a webhook chain (:class:`AdmissionRun`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core import gojson
from ..core.environ import AdmissionResult, User
from ..core.errors import BcsCode, BCSError


class PatchRefused(Exception):
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


class AdmissionRun:
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


def warning_headers(warnings: Sequence[str], limit: int = 32) -> list[tuple[str, str]]:
    """RFC 7234 ``Warning: 299 - "text"`` headers, as the apiserver sends them."""
    headers = []
    for text in list(dict.fromkeys(warnings))[:limit]:
        clean = "".join(c if c.isprintable() else " " for c in text)[:1024]
        clean = clean.replace("\\", "\\\\").replace('"', '\\"')
        headers.append(("Warning", f'299 - "{clean}"'))
    return headers
