"""Which recordings retention deletes: by age, then per user, then in total (pure).

Both stores (:mod:`.directory`, :mod:`bcs_middleware.store.recordings`) hand every recording
they hold to :func:`doomed` and delete what it names, so the rule is written once:

1. a finished recording older than ``max_age`` goes;
2. a user holding more than ``max_bytes_per_user`` loses their own oldest finished recordings
   until they are within it — one user's flood of sessions can never push another user's
   recordings out (the evidence of a session is not erasable by someone else's sessions);
3. then, while all recordings together exceed ``max_bytes``, the oldest finished recording
   of anyone goes. Bytes a user holds beyond their own bound (possible only while a session is
   still being written: a recording in progress is never deleted) do not count here, so even
   a session that has not ended yet cannot push other users' recordings out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Retention", "Stored", "doomed"]


@dataclass(frozen=True)
class Retention:
    """:param max_age: seconds a finished recording is kept (``None``: forever).
    :param max_bytes: the most all recordings may take (``None``: no bound).
    :param max_bytes_per_user: the most one user's recordings may take (``None``: no bound).
    """

    max_age: float | None = None
    max_bytes: int | None = None
    max_bytes_per_user: int | None = None


@dataclass(frozen=True)
class Stored:
    """A recording as retention sees it: ``finished_at`` is ``None`` while it is being written."""

    id: str
    user: str
    size: int
    finished_at: datetime | None


def doomed(recordings: Iterable[Stored], *, now: datetime, retention: Retention) -> list[str]:
    """The ids to delete, in the order the rules above pick them."""
    kept: list[Stored] = []
    gone: list[str] = []
    for rec in recordings:
        old = (retention.max_age is not None and rec.finished_at is not None
               and (now - rec.finished_at).total_seconds() > retention.max_age)
        if old:
            gone.append(rec.id)
        else:
            kept.append(rec)
    # Oldest first; a recording in progress sorts last (it is never picked).
    finished = sorted((r for r in kept if r.finished_at is not None), key=lambda r: (r.finished_at, r.id))
    usage: dict[str, int] = defaultdict(int)
    for rec in kept:
        usage[rec.user] += rec.size
    per_user = retention.max_bytes_per_user
    if per_user is not None:
        for rec in list(finished):
            if usage[rec.user] > per_user:
                usage[rec.user] -= rec.size
                gone.append(rec.id)
                finished.remove(rec)
    if retention.max_bytes is not None:
        def counted(user: str) -> int:
            return usage[user] if per_user is None else min(usage[user], per_user)

        total = sum(counted(user) for user in usage)
        for rec in finished:
            if total <= retention.max_bytes:
                break
            before = counted(rec.user)
            usage[rec.user] -= rec.size
            total -= before - counted(rec.user)
            gone.append(rec.id)
    return gone
