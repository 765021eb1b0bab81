"""What a recorded session is, and the small interface every place recordings live implements (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from ..core.requestinfo import RequestInfo, parse_query
from .retention import Retention

__all__ = ["RecordingSink", "RecordingStore", "RecordingUnavailable", "SessionInfo", "SessionQuery", "describe"]


class RecordingUnavailable(Exception):
    """A recording cannot be created or written (the message names the cause, never a secret)."""


@dataclass(frozen=True)
class SessionInfo:
    """One exec/attach session and its recording.

    ``status``: ``recording`` while it runs, ``complete``, ``failed`` (``failure`` says why;
    what was written before the failure stays readable), or ``interrupted``: the process
    writing it stopped (killed, crashed) before the session ended; what it wrote is kept and
    ``ended_at`` is its last sign of life.

    ``holder``: the writing process (:func:`~.liveness.process_identity`); ``heartbeat_at``: its
    last sign of life while the session runs.
    """

    id: str
    cluster_id: str
    user: str
    started_at: datetime
    groups: tuple[str, ...] = ()
    namespace: str = ""
    pod: str = ""
    container: str = ""
    command: tuple[str, ...] = ()
    subresource: str = "exec"
    tty: bool = False
    stdin_recorded: bool = False
    transport: str = ""
    ended_at: datetime | None = None
    exit_code: int | None = None
    bytes_to_upstream: int = 0
    bytes_to_client: int = 0
    size: int = 0
    status: str = "recording"
    failure: str = ""
    holder: str = ""
    heartbeat_at: datetime | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def ended(self, **changes: Any) -> SessionInfo:
        return replace(self, **changes)

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["groups"] = list(self.groups)
        doc["command"] = list(self.command)
        for key in ("started_at", "ended_at", "heartbeat_at"):
            value = getattr(self, key)
            doc[key] = value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None
        doc.pop("extra")
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SessionInfo:
        values = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        values["groups"] = tuple(values.get("groups") or ())
        values["command"] = tuple(values.get("command") or ())
        for key in ("started_at", "ended_at", "heartbeat_at"):
            if values.get(key):
                values[key] = datetime.fromisoformat(str(values[key]).replace("Z", "+00:00"))
        return cls(**values)


@dataclass(frozen=True)
class SessionQuery:
    """Filters of a listing; ``clusters``: only these (``None``: any)."""

    cluster_id: str | None = None
    user: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    clusters: frozenset[str] | None = None
    limit: int = 500

    def matches(self, info: SessionInfo) -> bool:
        return ((self.cluster_id is None or info.cluster_id == self.cluster_id)
                and (self.user is None or info.user == self.user)
                and (self.since is None or (info.ended_at or info.started_at) >= self.since)
                and (self.until is None or info.started_at <= self.until)
                and (self.clusters is None or info.cluster_id in self.clusters))


class RecordingSink(Protocol):
    """One recording being written."""

    def write(self, text: str) -> None: ...

    def close(self, info: SessionInfo) -> None:
        """The recording is over: keep its final description (also after a failure)."""


class SessionReader(Protocol):
    """What ``/rest/sessions`` reads of the recordings."""

    def sessions(self, query: SessionQuery) -> list[SessionInfo]:
        """Newest first."""

    def get(self, session_id: str) -> SessionInfo | None: ...

    def read(self, session_id: str) -> Iterator[bytes]:
        """The asciicast file's bytes, in pieces."""


class RecordingStore(Protocol):
    """Where recordings live: created, listed, read, pruned."""

    def create(self, info: SessionInfo) -> RecordingSink:
        """Start a recording; :class:`RecordingUnavailable` when it cannot be written."""

    def sessions(self, query: SessionQuery) -> list[SessionInfo]:
        """Newest first."""

    def get(self, session_id: str) -> SessionInfo | None: ...

    def read(self, session_id: str) -> Iterator[bytes]:
        """The asciicast file's bytes, in pieces."""

    def interrupt(self, info: SessionInfo) -> None:
        """End a session whose writer is gone as ``info`` says (status ``interrupted``), keeping
        what was written whole (a line the writer was cut in the middle of is dropped);
        :class:`RecordingUnavailable` when it cannot be written."""

    def in_progress(self) -> list[SessionInfo]:
        """The sessions still marked ``recording``, with their size and last heartbeat."""

    def heartbeat(self, session_ids: Sequence[str], now: datetime) -> None:
        """The writer of these sessions is alive at ``now``."""

    def prune(self, *, now: datetime, retention: Retention) -> int:
        """Delete what :func:`~.retention.doomed` names (finished recordings only); how many."""


_TRUE = ("true", "1")


def describe(info: RequestInfo, *, cluster_id: str, user: str, groups: tuple[str, ...], query: str,
             transport: str, started_at: datetime) -> SessionInfo:
    """A session as the request's facts and the connect options sent upstream describe it
    (``container``, ``command``, ``tty``: ``PodExecOptions``/``PodAttachOptions``, as the
    apiserver decodes the query)."""
    options = parse_query(query)
    return SessionInfo(
        id="", cluster_id=cluster_id, user=user, groups=groups, started_at=started_at,
        namespace=info.namespace, pod=info.name, container=(options.get("container") or [""])[0],
        command=tuple(options.get("command") or ()), subresource=info.connect_subresource,
        tty=(options.get("tty") or [""])[0].lower() in _TRUE, transport=transport,
    )
