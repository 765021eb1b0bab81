"""What every audit export backend is to the shipper that feeds it: ``process`` and ``shutdown``.

A backend receives events as their JSON (the spool's records), in order, and delivers a
prefix of them: :class:`Outcome` says how many it delivered and how many it dropped by
rule (too large even after truncation, refused for good by the receiver); the shipper
acknowledges exactly that many in the spool. When it cannot deliver (the receiver is down,
a timeout) it raises :class:`DeliveryFailed` carrying what it did deliver before: those are
acknowledged, the rest are tried again after a backoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["AuditBackend", "DeliveryFailed", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """The first ``delivered + dropped`` records are done (in order, mixed)."""

    delivered: int = 0
    dropped: int = 0

    @property
    def done(self) -> int:
        return self.delivered + self.dropped

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(self.delivered + other.delivered, self.dropped + other.dropped)


class DeliveryFailed(Exception):
    """The receiver could not take the records (for now): retry after a backoff.

    :param message: why, for the log (never a credential, never an event).
    :param outcome: what was done before the failure (acknowledged all the same).
    """

    def __init__(self, message: str, outcome: Outcome = Outcome()) -> None:
        super().__init__(message)
        self.outcome = outcome


class AuditBackend(Protocol):
    """Delivers events somewhere (a webhook, syslog).

    ``name`` is its metrics label (``webhook``, ``syslog``): a fixed word, never
    configuration.
    """

    name: str

    def process(self, records: Sequence[bytes]) -> Outcome:
        """Deliver a prefix of ``records`` (each an event's JSON); raise :class:`DeliveryFailed`."""
        ...

    def shutdown(self) -> None:
        """Close connections; nothing is delivered after it."""
        ...
