"""What the per-user limits are: one YAML file (``serve --limits-config FILE``, ini ``limits_config``).

Every key is optional; a file may be empty (the defaults below). An unknown key, a
negative number or a wrong type is a :class:`~bcs_middleware.core.errors.ConfigError` at
start, naming the key::

    enabled: true
    user:                      # each user, across this instance's workers
      rate: 50                 # requests per second (token bucket refill)
      burst: 100               # the bucket's size: what a cold kubectl may send at once
      inflight: 16             # ordinary requests in flight (more wait in the user's queue)
      long_running: 100        # watches, logs, exec/attach/port-forward sessions held open
    users:                     # per-user overrides of the above (a bot that needs more)
      argocd: {rate: 200, burst: 400, inflight: 64, long_running: 1000}
    groups:                    # in-flight cap of all a group's members together
      ci-bots: 32
    cluster:                   # what the gateway sends one cluster's apiserver at most
      inflight: 200
      long_running: 2000
    queue:
      seats_per_worker: 32     # ordinary requests one worker serves at once; beyond, users take turns
      length: 64               # requests one user may have waiting in one worker
      wait: 5s                 # then 429
      refusal_delay: 1s        # a 429 is answered no sooner (gevent workers; 0: at once)
      turn_after: 2            # a user's requests in flight in one worker before each more waits its turn (null: never)
    exempt:
      superusers: true
      users: [prometheus]
      routes: [health, readiness, metrics]
    clients:                   # the gateway's own clients, per worker
      upstream_idle_per_cluster: 32
      upstream_identities: 512
      rbac_sync_workers: 8
      database_connections: 5  # the database pool: connections kept open
      database_overflow: 10    # and opened beyond them under a burst (then closed)
    discovery_cache:
      enabled: true
      ttl: 30s                 # served without asking the apiserver; then revalidated (ETag)
      max_entry_bytes: 16MiB
      max_bytes: 128MiB        # per worker

``null`` for a number turns that limit off. The defaults are sized for a 2-core instance
with two workers (figures in ``bench/README.md``): one user cannot take more than half of
what the instance serves at once, and the 429s it gets instead cost far less than the
requests they stand for.

What holds where: the user, group and cluster counts and buckets are shared by the workers of
one instance (:mod:`bcs_middleware.limits.table`); several instances behind a load balancer
each apply them, so a user's share of the whole deployment is these times the number of instances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from ..core import converters as conv
from ..core.errors import ConfigError
from ..core.routes import RouteKind

#: Route kinds never limited unless the file says otherwise: probes and the scraper must
#: get through an overloaded gateway, or it is restarted for being busy.
DEFAULT_EXEMPT_ROUTES: tuple[RouteKind, ...] = ("health", "readiness", "metrics")
_ROUTE_KINDS = frozenset(RouteKind.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class UserLimits:
    """One user's limits; ``None`` is no limit.

    :param rate: tokens per second added to the user's bucket; every request takes one.
    :param burst: the bucket's size.
    :param inflight: ordinary (not long-running) requests in flight at once.
    :param long_running: long-running requests (watch, logs, exec, attach, port-forward,
        proxy, any upgrade) open at once.
    """

    rate: float | None = 50.0
    burst: int = 100
    inflight: int | None = 16
    long_running: int | None = 100


@dataclass(frozen=True)
class ClusterLimits:
    """What one cluster's apiserver receives through this instance at most (``None``: no limit)."""

    inflight: int | None = 200
    long_running: int | None = 2000


@dataclass(frozen=True)
class QueueSettings:
    """Fair queuing in each worker.

    :param seats_per_worker: ordinary requests a worker serves at once; when all are taken,
        requests wait in per-user queues and users are served in turn.
    :param length: requests one user may have waiting in one worker (more: 429 at once).
    :param wait: seconds a request waits for a seat before it is refused (429).
    :param refusal_delay: seconds after its arrival before a refused request gets its
        ``429``, under the gevent worker (a waiting greenlet costs no CPU). A client that
        ignores ``Retry-After`` and asks again at once, on many connections, would otherwise
        turn the refusals themselves into the load that the limits keep off the light
        users: each of its connections now asks at most once per delay. Under gthread a
        waiting refusal would hold one of the worker's threads, so refusals go at once there.
    :param turn_after: requests one user may have in flight in one worker (ordinary and
        long-running) before each further one waits for its turn of the worker's loop
        (:mod:`bcs_middleware.core.turns`; gevent workers; ``None``: never). A user with many
        requests at once then gets one more of them going per turn, after the work already in,
        instead of a whole burst ahead of everyone's; a user with a few is never held.
    """

    seats_per_worker: int | None = 32
    length: int = 64
    wait: float = 5.0
    refusal_delay: float = 1.0
    turn_after: int | None = 2


@dataclass(frozen=True)
class DiscoveryCacheSettings:
    """The per-cluster cache of discovery and OpenAPI documents (:mod:`bcs_middleware.layers.discovery_cache`)."""

    enabled: bool = True
    ttl: float = 30.0
    max_entry_bytes: int = 16 * 1024 * 1024
    max_bytes: int = 128 * 1024 * 1024


@dataclass(frozen=True)
class ClientSettings:
    """Bounds of the gateway's own clients, per worker (each shown as ``bcs_limits_capacity``).

    :param upstream_idle_per_cluster: idle keep-alive connections kept per apiserver identity;
        under a burst more are opened and then closed (a new TLS handshake each next time), so
        a cluster busier than this at once pays handshakes.
    :param upstream_identities: apiserver identities (address, CA, credential) whose idle
        connections and TLS contexts are kept.
    :param rbac_sync_workers: clusters the RBAC subscription writes bindings to at once.
    :param database_connections: connections to the database each worker keeps open (the
        store's reads of tokens, credentials, permissions and admission definitions; most are
        cached, so a few serve thousands of requests a second).
    :param database_overflow: connections opened beyond those under a burst, then closed; a
        request that finds all of them busy waits for one (SQLAlchemy's pool timeout, 30 s).
    """

    upstream_idle_per_cluster: int = 32
    upstream_identities: int = 512
    rbac_sync_workers: int = 8
    database_connections: int = 5
    database_overflow: int = 10


@dataclass(frozen=True)
class LimitSettings:
    """Everything ``--limits-config`` sets (see the module docs)."""

    enabled: bool = True
    user: UserLimits = field(default_factory=UserLimits)
    users: tuple[tuple[str, UserLimits], ...] = ()
    groups: tuple[tuple[str, int], ...] = ()
    cluster: ClusterLimits = field(default_factory=ClusterLimits)
    queue: QueueSettings = field(default_factory=QueueSettings)
    exempt_superusers: bool = True
    exempt_users: frozenset[str] = frozenset()
    exempt_routes: frozenset[str] = frozenset(DEFAULT_EXEMPT_ROUTES)
    discovery_cache: DiscoveryCacheSettings = field(default_factory=DiscoveryCacheSettings)
    clients: ClientSettings = field(default_factory=ClientSettings)

    def for_user(self, name: str) -> UserLimits:
        for user, limits in self.users:
            if user == name:
                return limits
        return self.user


def _number(kind: Callable[[Any], Any], minimum: float) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"not a number: {value!r}")
        number = kind(value)
        if number < minimum:
            raise ValueError(f"must be at least {minimum}: {value!r}")
        return number
    return convert


def _required(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if value is None:
            raise ValueError("cannot be null")
        return convert(value)
    return checked


_count = _number(int, 1)
_rate = _number(float, 0.001)


def _duration(value: Any, *, zero: bool = False) -> float:
    """Seconds (``30``, ``"500ms"``, ``"5s"``); positive, or also 0 with ``zero``."""
    seconds = conv.seconds(value if isinstance(value, int | float) else str(value))
    if seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"must not be negative: {value!r}" if zero else f"must be positive: {value!r}")
    return seconds


def _size(value: Any) -> int:
    return conv.size(value if isinstance(value, int) else str(value))


def _section(cls: type, raw: Any, where: str, converters: Mapping[str, Callable[[Any], Any]],
             base: Any = None) -> Any:
    if raw is None:
        return base if base is not None else cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, not {type(raw).__name__}")
    values = {}
    for key, value in raw.items():
        if key not in converters:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(converters))})")
        try:
            values[key] = converters[key](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from None
    return replace(base, **values) if base is not None else cls(**values)


_USER = {"rate": _rate, "burst": _required(_count), "inflight": _count, "long_running": _count}
_CLUSTER = {"inflight": _count, "long_running": _count}
_Converters = dict[str, Callable[[Any], Any]]
_QUEUE: _Converters = {"seats_per_worker": _count, "length": _required(_count), "wait": _duration,
                       "refusal_delay": partial(_duration, zero=True), "turn_after": _count}
_CACHE: _Converters = {"enabled": conv.asbool, "ttl": _duration, "max_entry_bytes": _size, "max_bytes": _size}
_CLIENTS = {"upstream_idle_per_cluster": _required(_count), "upstream_identities": _required(_count),
            "rbac_sync_workers": _required(_count), "database_connections": _required(_count),
            "database_overflow": _required(_number(int, 0))}
_TOP = frozenset(item.name for item in fields(LimitSettings)) - {"exempt_superusers", "exempt_users",
                                                               "exempt_routes"} | {"exempt"}


def parse(document: Any, source: str = "limits") -> LimitSettings:
    """The settings of a parsed YAML document (``None``: every default)."""
    if document is None:
        return LimitSettings()
    if not isinstance(document, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top")
    unknown = set(document) - _TOP
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(map(str, unknown))[0]!r} (known: {', '.join(sorted(_TOP))})")
    user = _section(UserLimits, document.get("user"), f"{source}: user", _USER)
    users_raw = document.get("users") or {}
    groups_raw = document.get("groups") or {}
    if not isinstance(users_raw, Mapping) or not isinstance(groups_raw, Mapping):
        raise ConfigError(f"{source}: users and groups are mappings")
    users = tuple((str(name), _section(UserLimits, raw or {}, f"{source}: users.{name}", _USER, base=user))
                  for name, raw in users_raw.items())
    groups = []
    for name, cap in groups_raw.items():
        try:
            groups.append((str(name), _required(_count)(cap)))
        except ValueError as exc:
            raise ConfigError(f"{source}: groups.{name}: {exc}") from None
    exempt = document.get("exempt") or {}
    if not isinstance(exempt, Mapping) or set(exempt) - {"superusers", "users", "routes"}:
        raise ConfigError(f"{source}: exempt takes superusers, users and routes")
    routes = frozenset(map(str, exempt.get("routes", DEFAULT_EXEMPT_ROUTES) or ()))
    if routes - _ROUTE_KINDS:
        raise ConfigError(f"{source}: exempt.routes: unknown route kind {sorted(routes - _ROUTE_KINDS)[0]!r} "
                          f"(known: {', '.join(sorted(_ROUTE_KINDS))})")
    try:
        enabled = conv.asbool(document.get("enabled", True))
        superusers = conv.asbool(exempt.get("superusers", True))
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return LimitSettings(
        enabled=enabled, user=user, users=users, groups=tuple(groups),
        cluster=_section(ClusterLimits, document.get("cluster"), f"{source}: cluster", _CLUSTER),
        queue=_section(QueueSettings, document.get("queue"), f"{source}: queue", _QUEUE),
        exempt_superusers=superusers, exempt_users=frozenset(map(str, exempt.get("users") or ())),
        exempt_routes=routes,
        discovery_cache=_section(DiscoveryCacheSettings, document.get("discovery_cache"),
                                 f"{source}: discovery_cache", _CACHE),
        clients=_section(ClientSettings, document.get("clients"), f"{source}: clients", _CLIENTS),
    )


def load(path: str | Path) -> LimitSettings:
    """The settings in the YAML file ``path``."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"limits_config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"limits_config {path}: not YAML: {exc}") from None
    return parse(document, f"limits_config {path}")
