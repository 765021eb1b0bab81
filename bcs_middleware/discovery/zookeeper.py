"""Discovery through ZooKeeper (kazoo) — the only module that imports kazoo.

:class:`ZookeeperDiscovery` watches the source system's layout::

    {root}/mesosdriver/{cluster_id}/{seq}   ephemeral sequential, JSON Endpoint
    {root}/scheduler/{seq}                  ephemeral sequential, lowest = master

and keeps an in-memory snapshot that the watch callbacks rebuild and swap in
whole. The snapshot also knows which cluster directories exist: a cluster whose
directory exists had a driver registered once (:meth:`ZookeeperDiscovery.registered`),
even when none is live now. Nodes directly under ``{root}/mesosdriver/`` (the
Mesos cluster's own layout, ``_c_<guid>-<ip><seq>``) are not cluster directories.
Requests only read the snapshot: nothing on the request path talks to
ZooKeeper. When the connection is suspended or the session lost, the last
snapshot keeps serving and :meth:`~ZookeeperDiscovery.stale` turns true (the
``bcs_discovery_stale`` gauge follows); kazoo re-arms the watches on reconnect
and, after a session expiry, the watch recipes re-read everything.

The client is started lazily by the first call in each process and a forked
process (gunicorn workers) gets its own — a kazoo client's threads do not
survive ``fork``. The first call in a process waits at most ``initial_wait``
seconds for the first snapshot; no later call waits.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from ..core.sockets import gevent_active
from ..telemetry import metrics
from .base import DEFAULT_ROOT, DRIVER_DIR, SCHEDULER_DIR, Endpoint, node_sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """What discovery knows at one moment; replaced whole, never changed in place."""

    drivers: dict[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    schedulers: tuple[Endpoint, ...] = ()
    #: clusters whose driver directory exists: a driver registered once (the
    #: directory is persistent, its ephemeral nodes are not)
    clusters: frozenset[str] = frozenset()


def _ordered(children: list[str]) -> list[str]:
    # Sequence order; names without a ZooKeeper sequence go last, by name.
    return sorted(children, key=lambda name: (node_sequence(name) is None, node_sequence(name) or 0, name))


def make_client(hosts: str, timeout: float) -> Any:
    """A kazoo client that reconnects forever but retries each command a bounded number of times.

    Under the gevent worker its I/O and callbacks run in greenlets (kazoo's gevent
    handler): its default handler's threads and ``select`` would be greenlets anyway
    after monkey-patching, but kazoo documents the gevent handler as the one to use.
    """
    handler = None
    retry_sleep: dict[str, Any] = {}
    if gevent_active():
        from kazoo.handlers.gevent import SequentialGeventHandler

        handler = SequentialGeventHandler()
        # kazoo refuses retry policies whose sleep is not the handler's; the retry's default is
        # the ``time.sleep`` bound when kazoo was first imported, which is the unpatched one when
        # a gunicorn master imported kazoo (its ZooKeeper hooks) before the worker patched.
        retry_sleep = {"sleep_func": handler.sleep_func}
    return KazooClient(
        hosts=hosts,
        handler=handler,
        timeout=timeout,
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2.0, **retry_sleep},
        command_retry={"max_tries": 3, "delay": 0.1, "max_delay": 1.0, "deadline": timeout, **retry_sleep},
    )


#: how long a process exiting waits for its connected ZooKeeper client to stop
EXIT_WAIT = 0.5


def start_client(client: Any) -> None:
    """Start ``client`` in the background, and make sure a process can always exit, quickly.

    kazoo registers an exit hook that joins its callback threads without a time
    limit; when ZooKeeper is unreachable one of them can be blocked in a watch's
    read, and stopping the client waits for its connection thread's reconnect
    backoff: a gunicorn worker would outlive the graceful timeout and be killed.
    Our hook is registered after kazoo's, so it runs first: it takes kazoo's hook
    away and stops the client on a daemon thread, waiting at most
    :data:`EXIT_WAIT` seconds (kazoo's threads are daemons: an exiting process
    does not wait for them).
    """
    client.start_async()
    atexit.register(_stop_at_exit, client)


def _stop_at_exit(client: Any) -> None:
    atexit.unregister(client.handler.stop)
    stopper = threading.Thread(target=_stop_quietly, args=(client,), daemon=True)
    stopper.start()
    # Disconnected, the close would not reach ZooKeeper anyway: not waited for.
    stopper.join(EXIT_WAIT if client.state == KazooState.CONNECTED else 0)


def _stop_quietly(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # exiting: nothing else to do with an error
        log.debug("error stopping a ZooKeeper client at exit", exc_info=True)


class _Session:
    """One process's client, watches and snapshot."""

    def __init__(self, hosts: str, root: str, timeout: float) -> None:
        self.pid = os.getpid()
        self.root = root.rstrip("/")
        self.timeout = timeout
        self.snapshot = Snapshot()
        self.stale = True
        self.reads = 0  # ZooKeeper reads made by the watch callbacks (for benchmarks)
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self._lock = threading.Lock()
        self._data: dict[str, Endpoint | None] = {}  # node path -> parsed data
        self._clusters: set[str] = set()
        self._bootstrapped = False
        self._closed = False
        self._seen = {DRIVER_DIR: False, SCHEDULER_DIR: False}
        self.client = make_client(hosts, timeout)
        self.client.add_listener(self._on_state)
        start_client(self.client)

    # -- connection state (runs on kazoo's connection thread: never block here) ------

    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.CONNECTED:
            self._set_stale(False)
            if not self._bootstrapped:
                self._bootstrapped = True
                self.client.handler.spawn(self._bootstrap)
        else:
            self._set_stale(True)
            if state == KazooState.LOST:
                log.warning("ZooKeeper session lost; serving the last discovery snapshot")
            else:
                log.warning("ZooKeeper connection suspended; serving the last discovery snapshot")

    def _set_stale(self, stale: bool) -> None:
        self.stale = stale
        metrics.DISCOVERY_STALE.set(1 if stale else 0)

    def _bootstrap(self) -> None:
        # DataWatch follows each directory's existence, so discovery also works
        # before any driver or scheduler ever created it (and never creates it).
        for name, start in ((DRIVER_DIR, self._watch_drivers), (SCHEDULER_DIR, self._watch_schedulers)):
            DataWatch(self.client, f"{self.root}/{name}", self._dir_watcher(name, start))

    def _dir_watcher(self, name: str, start: Callable[[], None]) -> Callable[[Any, Any], Any]:
        watching = [False]

        def on_dir(data: Any, stat: Any) -> Any:
            if self._closed:
                return False
            if stat is None:
                watching[0] = False
                self._swap(clear=name)
            elif not watching[0]:
                watching[0] = True
                start()
            self._mark_seen(name)
            return None

        return on_dir

    def _mark_seen(self, name: str) -> None:
        self._seen[name] = True
        if all(self._seen.values()):
            self.ready.set()

    # -- drivers -----------------------------------------------------------------------

    def _watch_drivers(self) -> None:
        path = f"{self.root}/{DRIVER_DIR}"

        def on_clusters(children: list[str]) -> Any:
            if self._closed:
                return False
            self.reads += 1
            # Drivers' nodes of the Mesos cluster's own layout sit directly below (named
            # "_c_<guid>-<ip><seq>" by go-zookeeper): not cluster directories.
            wanted = {name for name in children if not name.startswith("_c_")}
            with self._lock:
                new = wanted - self._clusters
                gone = self._clusters - wanted
                self._clusters = wanted
            self._swap(clusters=frozenset(wanted))
            for cluster in gone:
                self._swap(cluster=cluster, endpoints=None)
            for cluster in sorted(new):
                ChildrenWatch(self.client, f"{path}/{cluster}", self._cluster_watcher(cluster))
            return None

        ChildrenWatch(self.client, path, on_clusters)

    def _cluster_watcher(self, cluster: str) -> Callable[[list[str]], Any]:
        path = f"{self.root}/{DRIVER_DIR}/{cluster}"

        def on_nodes(children: list[str]) -> Any:
            if self._closed or cluster not in self._clusters:
                self._swap(cluster=cluster, endpoints=None)
                return False  # stops this watch: the cluster directory went away
            self._swap(cluster=cluster, endpoints=self._read_nodes(path, children))
            return None

        return on_nodes

    # -- schedulers ------------------------------------------------------------------------

    def _watch_schedulers(self) -> None:
        path = f"{self.root}/{SCHEDULER_DIR}"

        def on_nodes(children: list[str]) -> Any:
            if self._closed:
                return False
            self._swap(schedulers=self._read_nodes(path, children))
            return None

        ChildrenWatch(self.client, path, on_nodes)

    # -- helpers ---------------------------------------------------------------------------

    def _read_nodes(self, path: str, children: list[str]) -> tuple[Endpoint, ...]:
        """Data of each child in sequence order; node data is cached by path (ephemeral
        sequential nodes are written once, a re-registration is a new node)."""
        names = _ordered(children)
        pending = {}
        for name in names:
            full = f"{path}/{name}"
            if full not in self._data:
                pending[full] = self.client.get_async(full)
        for full, result in pending.items():
            self.reads += 1
            try:
                data, _stat = result.get(timeout=self.timeout)
            except NoNodeError:
                continue
            except (KazooException, TimeoutError) as exc:
                log.warning("cannot read %s: %s", full, type(exc).__name__)
                continue
            try:
                self._data[full] = Endpoint.from_json(data or b"")
            except ValueError as exc:
                log.warning("ignoring %s: %s", full, exc)
                self._data[full] = None
        live = {f"{path}/{name}" for name in names}
        for full in [p for p in self._data if p.startswith(path + "/") and p not in live]:
            self._data.pop(full, None)
        endpoints = (self._data.get(f"{path}/{name}") for name in names)
        return tuple(e for e in endpoints if e is not None)

    def _swap(
        self,
        *,
        cluster: str | None = None,
        endpoints: tuple[Endpoint, ...] | None = None,
        schedulers: tuple[Endpoint, ...] | None = None,
        clusters: frozenset[str] | None = None,
        clear: str | None = None,
    ) -> None:
        with self._lock:
            old = self.snapshot
            drivers = dict(old.drivers)
            scheds = old.schedulers
            known = old.clusters if clusters is None else clusters
            if cluster is not None:
                if endpoints:
                    drivers[cluster] = endpoints
                else:
                    drivers.pop(cluster, None)
            if schedulers is not None:
                scheds = schedulers
            if clear == DRIVER_DIR:
                drivers = {}
                known = frozenset()
                self._clusters = set()
            elif clear == SCHEDULER_DIR:
                scheds = ()
            self.snapshot = Snapshot(drivers, scheds, known)
        with self.changed:
            self.changed.notify_all()

    def close(self) -> None:
        self._closed = True
        if self.pid != os.getpid():
            return  # the parent's client: its threads are not ours to stop
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # closing must never raise during shutdown
            log.debug("error closing the ZooKeeper client", exc_info=True)


class ZookeeperDiscovery:
    """Drivers and schedulers from ZooKeeper, served from an in-memory snapshot.

    :param hosts: kazoo hosts string, ``"zk1:2181,zk2:2181"`` (an optional
        ``/chroot`` suffix is honoured).
    :param root: the endpoints root of the source layout.
    :param timeout: ZooKeeper session timeout in seconds; also bounds each read.
    :param initial_wait: seconds the first call in a process may wait for the
        first snapshot (``0`` never waits; then early requests may see no driver).

    Example::

        discovery = ZookeeperDiscovery("zk1:2181,zk2:2181,zk3:2181")
        discovery.drivers("BCS-MESOS-10001")
    """

    def __init__(
        self,
        hosts: str,
        *,
        root: str = DEFAULT_ROOT,
        timeout: float = 10.0,
        initial_wait: float = 5.0,
    ) -> None:
        if not hosts.strip():
            raise ValueError("ZooKeeper hosts are required")
        if not root.startswith("/"):
            raise ValueError(f"root must be an absolute ZooKeeper path, got {root!r}")
        self.hosts = hosts.strip()
        self.root = root.rstrip("/") or "/"
        self.timeout = timeout
        self.initial_wait = initial_wait
        self._session: _Session | None = None
        self._lock = threading.Lock()

    def _current(self) -> _Session:
        session = self._session
        if session is not None and session.pid == os.getpid():
            return session
        with self._lock:
            session = self._session
            if session is None or session.pid != os.getpid():
                session = _Session(self.hosts, self.root, self.timeout)
                if self.initial_wait > 0:
                    session.ready.wait(self.initial_wait)
                # Published only now: other threads queue on the lock meanwhile
                # instead of reading an empty first snapshot.
                self._session = session
        return session

    def start(self) -> None:
        """Start this process's client now (e.g. in gunicorn ``post_fork``) instead of lazily."""
        self._current()

    @property
    def snapshot(self) -> Snapshot:
        return self._current().snapshot

    def drivers(self, cluster_id: str) -> tuple[Endpoint, ...]:
        return self._current().snapshot.drivers.get(cluster_id, ())

    def registered(self, cluster_id: str) -> bool:
        return cluster_id in self._current().snapshot.clusters

    def scheduler_master(self) -> Endpoint | None:
        schedulers = self._current().snapshot.schedulers
        return schedulers[0] if schedulers else None

    def schedulers(self) -> tuple[Endpoint, ...]:
        return self._current().snapshot.schedulers

    def stale(self) -> bool:
        return self._current().stale

    @property
    def reads(self) -> int:
        """ZooKeeper reads this process's watches made so far (requests make none)."""
        return self._current().reads

    def wait_for(self, predicate: Callable[[Snapshot], bool], timeout: float) -> bool:
        """Block until ``predicate(snapshot)`` holds or ``timeout`` passes (tests, tools)."""
        session = self._current()
        deadline = time.monotonic() + timeout
        with session.changed:
            while not predicate(session.snapshot):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                session.changed.wait(min(remaining, 0.1))
        return True

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()
