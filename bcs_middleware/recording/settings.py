"""Session recording settings: the policy per cluster, stdin, where recordings live, how long (pure).

ini keys (the gateway's ``[app:main]``; ``serve`` flags of the same names)::

    record = off | on | required          ; the policy of every cluster
    record_clusters =                     ; per-cluster policies, one "ID = MODE" per line
        prod-1 = required
        lab = off
    record_stdin = false                  ; stdin carries passwords typed at prompts: off by default
    recording_store = directory | database
    recording_dir = recordings            ; relative: in the data directory
    recording_max_age = 720h              ; retention by age (0: none)
    recording_max_size = 10GiB            ; retention by total size, oldest first (0: none)
    recording_max_size_per_user =         ; one user's bound, applied first (default: a tenth
                                          ; of recording_max_size; 0: none); also the most
                                          ; one recording may take while its session runs
    recording_retention_interval = 10m    ; how often each worker applies retention
    recording_heartbeat_timeout = 5m      ; a session whose writer gave no sign of life this
                                          ; long (or whose process is gone) is interrupted
    recording_buffer = 4MiB               ; bytes a session may hold while the store catches up
    recording_stall_timeout = 10s         ; a store that takes no bytes this long has failed

``required`` refuses a session whose recording cannot be written (fail closed) and ends
one whose recording fails midway; ``on`` lets the session through unrecorded and counts
the failure (``bcs_recording_failures_total``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from ..core import converters as conv
from ..core.errors import ConfigError
from .retention import Retention

__all__ = ["ATTRIBUTES", "MODES", "OPTIONS", "Mode", "RecordingSettings"]

Mode = Literal["off", "on", "required"]
MODES: tuple[Mode, ...] = ("off", "on", "required")
StoreKind = Literal["directory", "database"]


def mode(value: str) -> Mode:
    name = value.strip().lower()
    if name not in MODES:
        raise ValueError(f"expected off, on or required, got {value!r}")
    return name


def cluster_modes(value: str | Mapping[str, str]) -> dict[str, Mode]:
    """``ID = MODE`` lines (or ``ID=MODE`` words, as ``serve --record-cluster`` gives them)."""
    if isinstance(value, str) and "\n" not in value and "=" in value and " = " not in value:
        value = "\n".join(value.split())
    return {cluster: mode(m) for cluster, m in conv.mapping(value).items()}


def store_kind(value: str) -> StoreKind:
    name = value.strip().lower()
    if name not in ("directory", "database"):
        raise ValueError(f"expected directory or database, got {value!r}")
    return cast(StoreKind, name)


OPTIONS: dict[str, conv.Converter] = {
    "record": mode,
    "record_clusters": cluster_modes,
    "record_stdin": conv.asbool,
    "recording_store": store_kind,
    "recording_dir": conv.text,
    "recording_max_age": conv.seconds,
    "recording_max_size": conv.size,
    "recording_max_size_per_user": conv.size,
    "recording_retention_interval": conv.seconds,
    "recording_heartbeat_timeout": conv.seconds,
    "recording_buffer": conv.size,
    "recording_stall_timeout": conv.seconds,
}

#: The attribute of :class:`RecordingSettings` each ini key fills.
ATTRIBUTES: dict[str, str] = {
    "record": "mode", "record_clusters": "clusters", "record_stdin": "stdin", "recording_store": "store",
    "recording_dir": "directory", "recording_max_age": "max_age", "recording_max_size": "max_bytes",
    "recording_buffer": "buffer", "recording_stall_timeout": "stall_timeout",
    "recording_max_size_per_user": "max_bytes_per_user", "recording_retention_interval": "retention_interval",
    "recording_heartbeat_timeout": "heartbeat_timeout",
}

#: ``max_bytes_per_user`` when it is not set: this share of ``max_bytes``.
PER_USER_SHARE = 10
_PER_USER_DEFAULT = -1


@dataclass(frozen=True)
class RecordingSettings:
    """:param mode: the policy of clusters :attr:`clusters` does not name.
    :param clusters: ``(cluster id, mode)`` pairs.
    :param stdin: record what users type (``"i"`` events).
    :param store: ``directory`` (files in :attr:`directory`) or ``database`` (the gateway's
        database, so every instance sharing it lists and serves every recording).
    :param directory: where the directory store keeps recordings (``None``: ``recordings`` in
        the data directory).
    :param max_age: seconds a finished recording is kept (``None``: forever).
    :param max_bytes: the most all recordings may take; the oldest go first (``None``: no bound).
    :param max_bytes_per_user: the most one user's recordings may take, applied before
        ``max_bytes``: a user over it loses their own oldest recordings, so one user's sessions
        never evict another's (``None``: no bound; unset: ``max_bytes`` / :data:`PER_USER_SHARE`).
    :param retention_interval: seconds between two retention passes of a worker (one also runs
        when the worker starts).
    :param heartbeat_timeout: a session still marked ``recording`` whose writer process is gone,
        or that gave no heartbeat for this many seconds (another host's writer), is ended as
        ``interrupted`` by the next retention pass of any worker, what it wrote kept.
    :param buffer: bytes of one session held between the splice and the store.
    :param stall_timeout: seconds a full buffer may wait for the store before the recording fails.
    """

    mode: Mode = "off"
    clusters: tuple[tuple[str, Mode], ...] = ()
    stdin: bool = False
    store: StoreKind = "directory"
    directory: Path | None = None
    max_age: float | None = 30 * 86400.0
    max_bytes: int | None = 10 * 1024**3
    buffer: int = 4 * 1024 * 1024
    stall_timeout: float = 10.0
    max_bytes_per_user: int | None = _PER_USER_DEFAULT
    retention_interval: float = 600.0
    heartbeat_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.max_bytes_per_user == _PER_USER_DEFAULT:
            share = self.max_bytes // PER_USER_SHARE if self.max_bytes else None
            object.__setattr__(self, "max_bytes_per_user", share)
        if self.max_bytes and self.max_bytes_per_user and self.max_bytes_per_user > self.max_bytes:
            raise ValueError("recording_max_size_per_user cannot be more than recording_max_size")
        if self.retention_interval <= 0 or self.heartbeat_timeout <= 0:
            raise ValueError("recording_retention_interval and recording_heartbeat_timeout must be positive")

    @property
    def retention(self) -> Retention:
        return Retention(max_age=self.max_age, max_bytes=self.max_bytes, max_bytes_per_user=self.max_bytes_per_user)

    @property
    def max_bytes_per_recording(self) -> int | None:
        """The most one recording may take while it is written: the user's bound (else the
        total's). Retention deletes finished recordings only; a live session is cut off here."""
        return self.max_bytes_per_user or self.max_bytes or None

    @property
    def heartbeat_every(self) -> float:
        """Seconds between two heartbeats of a writer: a few within :attr:`heartbeat_timeout`."""
        return min(self.heartbeat_timeout / 4, 60.0)

    def mode_for(self, cluster_id: str) -> Mode:
        return dict(self.clusters).get(cluster_id, self.mode)

    @property
    def enabled(self) -> bool:
        return self.mode != "off" or any(m != "off" for _, m in self.clusters)

    @classmethod
    def from_ini(cls, values: Mapping[str, Any], context: Any) -> RecordingSettings:
        """The gateway configuration's ``recording`` section from its converted ini keys, named
        by attribute (:data:`ATTRIBUTES`, :mod:`bcs_middleware.compose.ini`); ``context.section``
        names the ini section in errors."""
        try:
            return cls.from_values(values)
        except ValueError as exc:
            raise ConfigError(f"[{context.section}] {exc}") from None

    @classmethod
    def from_options(cls, opts: Mapping[str, Any]) -> RecordingSettings:
        """The settings from converted :data:`OPTIONS` values, named by ini key (absent keys keep
        their defaults)."""
        return cls.from_values({ATTRIBUTES[key]: value for key, value in opts.items() if key in ATTRIBUTES})

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RecordingSettings:
        """The settings from converted values named by attribute."""
        settings = dict(values)
        if "clusters" in settings:
            settings["clusters"] = tuple(sorted(settings["clusters"].items()))
        directory = settings.pop("directory", None)
        if directory:
            settings["directory"] = Path(directory)
        for name in ("max_age", "max_bytes", "max_bytes_per_user"):  # 0: no bound
            if name in settings:
                settings[name] = settings[name] or None
        if settings.get("buffer", 64 * 1024) < 64 * 1024:
            raise ValueError("recording_buffer must be at least 64KiB (one read of the splice)")
        return cls(**settings)
