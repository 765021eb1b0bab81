"""Fair share between users: per-user rate and in-flight limits, and fair queuing.

:class:`LimitsMiddleware` sits right after token authentication. For each request of an
authenticated user (superusers, configured users and the health, readiness and metrics
routes are exempt by default) it:

1. takes a token from the user's bucket (``user.rate`` per second, ``user.burst`` at once);
   without one the answer is ``429`` at once, ``Retry-After`` saying when the next comes;
2. for a long-running request (a watch, logs, exec/attach/port-forward, proxy, any
   upgrade: :attr:`~bcs_middleware.core.facts.RequestFacts.long_running`, decided once by
   the request's facts) counts it against the user's and the cluster's long-running caps, or
   answers ``429``: such requests hold no seat (they wait on the network, not on a core) but
   each is a watch or a session the apiserver keeps — APF exempts them, this does not;
3. for any other request takes a seat in this worker and counts it against the user's, each
   of its capped groups' and the cluster's in-flight caps; when one is at its bound the request
   waits in its user's line and users are served in turn (:mod:`bcs_middleware.limits.fair`),
   then ``429`` when the line is full or the wait is over.

A refusal is answered ``queue.refusal_delay`` after the request arrived (under the gevent
worker), so that a client asking again at once cannot make the refusals the load, and then in
its turn of the worker's loop (:mod:`bcs_middleware.core.turns`), one refusal per turn after
the work already in: a bot's refusals, due together, are not one burst. Likewise an admitted
request of a user that already has ``queue.turn_after`` requests in flight in this worker
goes on in its turn: a user with many requests at once starts one more per turn, and a user
with a few never waits for a turn.

The counts and buckets are shared by the instance's workers (:mod:`bcs_middleware.limits.table`);
what is counted is released when the response is closed. A refusal is
:class:`~bcs_middleware.core.errors.TooManyRequests`: a Kubernetes ``Status`` (reason
``TooManyRequests``, ``details.retryAfterSeconds``) on tunnel paths, which kubectl and
client-go wait out and retry. Metrics count per limit (``bcs_limits_*``), never per user.

Reads ``bcs.user``, ``bcs.facts``; sets nothing.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core import turns
from ..core.cache import Cache
from ..core.errors import TooManyRequests
from ..core.sockets import gevent_active
from ..limits.fair import FairQueue, InFlight
from ..limits.settings import LimitSettings, load
from ..limits.table import BUCKET, INFLIGHT, LONG_RUNNING, OK, CounterTable, key_digest
from ..telemetry import metrics

#: The shared table's file in the server's own directory (``serve`` gives each server one:
#: :func:`bcs_middleware.serving.datadir.server_metrics_dir`), beside its metrics.
TABLE_FILE = "limits.table"


def shared_table_path() -> Path | None:
    """Where the workers of this server share their counts: the server's own directory, when
    it runs several workers under ``serve`` (``PROMETHEUS_MULTIPROC_DIR``); else ``None``."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(directory) / TABLE_FILE if directory else None


class _Released:
    """The response body; what the request counted is released once, when it is closed."""

    __slots__ = ("_iterable", "_release")

    def __init__(self, iterable: Iterable[bytes], release: Callable[[], None]) -> None:
        self._iterable = iterable
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._iterable)

    def __getattr__(self, name: str) -> Any:
        # What outer layers read of the body (the audit layer: an upgraded session's ``result``).
        return getattr(self._iterable, name)

    def close(self) -> None:
        release, self._release = self._release, None
        try:
            close = getattr(self._iterable, "close", None)
            if close is not None:
                close()
        finally:
            if release is not None:
                release()


@dataclass(frozen=True)
class _Plan:
    """What one kind of request counts against (:meth:`LimitsMiddleware._plan`): a pure function
    of the user, its groups, the cluster and whether it is long-running, so it is remembered."""

    kind: int
    bucket: tuple[bytes, float, int] | None
    claims: tuple[tuple[bytes, int | None], ...]
    names: tuple[str, ...]
    keys: tuple[bytes, ...]


class LimitsMiddleware:
    """Per-user limits and fair queuing (see the module docs).

    :param app: the next layer (the dispatcher).
    :param settings: the limits (:mod:`bcs_middleware.limits.settings`).
    :param table: the counts shared by this instance's workers; default one at
        :func:`shared_table_path` (this process's memory when there is none).
    :param clock: monotonic seconds (tests).
    """

    def __init__(self, app: Any, *, settings: LimitSettings, table: CounterTable | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 delay_refusals: Callable[[], bool] = gevent_active,
                 wait_turn: Callable[[], bool] = turns.wait_turn) -> None:
        self.app = app
        self.settings = settings
        self.table = table if table is not None else CounterTable(shared_table_path())
        self.clock = clock
        self.sleep = sleep
        self.delay_refusals = delay_refusals
        self.wait_turn = wait_turn
        queue = settings.queue
        self.queue = FairQueue(queue.seats_per_worker, length=queue.length, wait=queue.wait, clock=clock)
        self.in_flight = InFlight()
        self.group_caps = dict(settings.groups)
        # Keys are users (with their groups) and clusters: bounded, the large ones never kept.
        self._plans: Cache[tuple[str, tuple[str, ...], str | None, bool], _Plan] = Cache(
            max_entries=4096, loader=self._plan,
            admit=lambda key: len(key[0]) + sum(map(len, key[1])) + len(key[2] or "") <= 4096)
        self._admitted_at_once = metrics.LIMIT_ADMITTED.labels("ordinary", "false")
        self._long_admitted = metrics.LIMIT_ADMITTED.labels("long_running", "false")
        self._overflows = 0
        for bound, value in (("worker_seats", queue.seats_per_worker), ("user_turn_after", queue.turn_after),
                             ("user_inflight", settings.user.inflight),
                             ("user_long_running", settings.user.long_running),
                             ("cluster_inflight", settings.cluster.inflight),
                             ("cluster_long_running", settings.cluster.long_running)):
            metrics.LIMIT_CAPACITY.labels(bound).set(value or 0)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        user = env.get_user(environ)
        if user is None or not self.settings.enabled:
            return self.app(environ, start_response)
        facts = request_facts.of(environ)
        if facts.kind in self.settings.exempt_routes or (user.is_superuser and self.settings.exempt_superusers) \
                or user.name in self.settings.exempt_users:
            return self.app(environ, start_response)
        long_running = facts.long_running or facts.upgrade is not None
        plan = self._plans.load((user.name, user.groups, facts.cluster_id, long_running))
        arrived = self.clock()
        try:
            release = self._admit(user.name, plan, arrived)
        except TooManyRequests as exc:
            metrics.LIMIT_REFUSED.labels(exc.limit).inc()
            self._hold_refusal(arrived)
            return exc(environ, start_response)
        finally:
            self._note_overflows()
        turn_after = self.settings.queue.turn_after
        try:
            if turn_after is not None:
                count = self.in_flight.enter(user.name)
                release = self._counted(user.name, release)
                if count > turn_after:
                    self._wait_turn()
            body = self.app(environ, start_response)
        except BaseException:
            release()
            raise
        if type(body) is list:  # answered whole: nothing more is being done for it
            release()
            return body
        return _Released(body, release)

    def _plan(self, key: tuple[str, tuple[str, ...], str | None, bool]) -> _Plan:
        """What a request of this user, with these groups, to this cluster counts against."""
        name, groups, cluster_id, long_running = key
        limits = self.settings.for_user(name)
        user_key = key_digest("u:" + name)
        bucket = (user_key, limits.rate, limits.burst) if limits.rate is not None else None
        if long_running:
            claims = [(user_key, limits.long_running)]
            names = ["user_long_running"]
            if cluster_id is not None:
                claims.append((key_digest("c:" + cluster_id), self.settings.cluster.long_running))
                names.append("cluster_long_running")
        else:
            claims = [(user_key, limits.inflight)]
            names = ["user_inflight"]
            for group in groups:
                cap = self.group_caps.get(group)
                if cap is not None:
                    claims.append((key_digest("g:" + group), cap))
                    names.append("group_inflight")
            if cluster_id is not None:
                claims.append((key_digest("c:" + cluster_id), self.settings.cluster.inflight))
                names.append("cluster_inflight")
        return _Plan(LONG_RUNNING if long_running else INFLIGHT, bucket, tuple(claims), tuple(names),
                     tuple(key for key, _cap in claims))

    def _admit(self, user: str, plan: _Plan, now: float) -> Callable[[], None]:
        table = self.table
        if plan.kind == LONG_RUNNING:
            verdict, wait = table.admit(now, plan.bucket, LONG_RUNNING, plan.claims)
            if verdict != OK:
                raise self._refusal(verdict, wait, plan.names)
            self._long_admitted.inc()
            return lambda: table.release(LONG_RUNNING, plan.keys)

        def release() -> None:
            table.release(INFLIGHT, plan.keys)
            self.queue.leave()

        # One look at the shared table: a request over its rate is refused here and never
        # waits in a line; one within every cap takes a free seat and goes.
        bucket = plan.bucket
        verdict, wait = table.admit(now, bucket, INFLIGHT, plan.claims)
        if verdict == BUCKET:
            raise self._refusal(verdict, wait, plan.names)
        if verdict == OK:
            if self.queue.take_seat():
                self._admitted_at_once.inc()
                return release
            table.release(INFLIGHT, plan.keys)  # the seats are taken: wait for one in turn
            bucket = None  # its token is spent

        def acquire() -> str | None:
            verdict, _wait = table.admit(self.clock(), bucket, INFLIGHT, plan.claims)
            return None if verdict == OK else "user_rate" if verdict == BUCKET else plan.names[verdict]

        waited = self.queue.enter(user, acquire)
        if waited.limit:
            metrics.LIMIT_QUEUED.labels(waited.limit).inc()
            metrics.LIMIT_QUEUE_WAIT.labels(waited.limit).observe(waited.seconds)
        if not waited.granted:
            limit = "user_queue" if waited.full else waited.limit
            raise TooManyRequests(
                f"too many requests: the {limit.replace('_', ' ')} limit is reached, please try again later",
                retry_after=1, limit=limit)
        metrics.LIMIT_ADMITTED.labels("ordinary", "true" if waited.limit else "false").inc()
        return release

    def _wait_turn(self) -> None:
        """A busy user's request in its turn, counted and timed as waiting (``user_turn``) when
        there was a loop to wait for."""
        started = self.clock()
        if self.wait_turn():
            metrics.LIMIT_QUEUED.labels("user_turn").inc()
            metrics.LIMIT_QUEUE_WAIT.labels("user_turn").observe(self.clock() - started)

    def _counted(self, user: str, release: Callable[[], None]) -> Callable[[], None]:
        """``release``, and the request no longer in flight in this worker (:class:`InFlight`)."""
        def counted_release() -> None:
            self.in_flight.leave(user)
            release()
        return counted_release

    def _hold_refusal(self, arrived: float) -> None:
        """Answer a refusal no sooner than ``queue.refusal_delay`` after its request arrived
        (a request that waited in line for a seat has waited already), and then in its turn
        (:mod:`bcs_middleware.core.turns`): refusals sent together come due together."""
        delay = self.settings.queue.refusal_delay
        if delay > 0 and self.delay_refusals():
            remaining = delay - (self.clock() - arrived)
            if remaining > 0:
                self.sleep(remaining)
        self.wait_turn()

    @staticmethod
    def _refusal(verdict: int, wait: float, names: tuple[str, ...]) -> TooManyRequests:
        if verdict == BUCKET:
            return TooManyRequests("too many requests: the user's request rate is over its limit, please try "
                                   "again later", retry_after=math.ceil(wait), limit="user_rate")
        limit = names[verdict]
        return TooManyRequests(f"too many requests: the {limit.replace('_', ' ')} limit is reached, please try "
                               "again later", retry_after=1, limit=limit)

    def _note_overflows(self) -> None:
        overflows = self.table.overflows
        if overflows != self._overflows:
            metrics.LIMIT_TABLE_OVERFLOWS.inc(overflows - self._overflows)
            self._overflows = overflows


_OPTIONS: dict[str, conv.Converter] = {"limits_config": conv.text}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#limits``: per-user limits after token auth::

        [filter:limits]
        use = egg:bcs-middleware#limits
        # the YAML file of bcs_middleware/limits/settings.py; without it, the defaults
        limits_config = /etc/bcs/limits.yaml

        [pipeline:main]
        pipeline = request_context token_auth limits myapp
    """
    opts = conv.convert_options("filter:limits", local_conf, _OPTIONS)
    settings = load(opts["limits_config"]) if opts.get("limits_config") else LimitSettings()

    def make(app: Any) -> LimitsMiddleware:
        return LimitsMiddleware(app, settings=settings)

    return make
