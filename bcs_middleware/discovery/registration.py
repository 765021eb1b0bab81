"""Self-registration in ZooKeeper: an ephemeral sequential node per server.

:class:`Registrar` writes ``Endpoint.to_json()`` as an ephemeral sequential
node under a directory of the source layout (drivers under
``{root}/mesosdriver/{cluster_id}/``, gateways under ``{root}/apiserver/``),
writes it again after a session expiry removed it, and deletes it on a clean
shutdown. The node disappears by itself when the process dies (its session
ends), which is what lets gateways stop routing to a dead driver.

Node names are the ones bk-bcs's Go services write (``RegisterDiscover`` →
go-zookeeper's ``CreateProtectedEphemeralSequential``): ``_c_<32 hex guid>-<ip>``
followed by ZooKeeper's 10-digit sequence, so Go tools listing the directory
see what they expect.

A Mesos driver registers twice, as bk-bcs's driver does (bk-bcs #136): in the
gateways' layout ``{root}/mesosdriver/{cluster_id}/`` (:func:`driver_path`), and
in the Mesos cluster's own layout ``{root}/mesosdriver/`` (:func:`mesos_driver_path`,
node ``_c_<guid>-<ip><seq>`` directly below it, without the external address),
where the cluster's own tools look for it. Here both live in the ZooKeeper
given to the driver (the one its schedulers register in).

Under gunicorn there must be one registration per *server*, not per worker:
:func:`gunicorn_hooks` returns ``when_ready``/``on_exit`` hooks that start one
**registration process** beside the master (:class:`RegistrationProcess`, this
module run as ``python -m``), and stop it *first* when the master is told to
stop (SIGTERM, SIGINT, SIGQUIT): the nodes are deleted before gunicorn closes
its listening sockets and waits for the workers, so gateways stop routing to a
driver before it stops answering. Not in the master itself: under the gevent
worker the master is monkey-patched, its ZooKeeper client would be greenlets and
a socket, and every forked worker would inherit them and keep them running (two
processes reading one session's socket lose the registration). A process of its
own (spawned, not forked) holds the only session whatever the worker class, and
ends its session — so the nodes go — when the master is gone, even killed.
Example ``gunicorn.conf.py``::

    from bcs_middleware.discovery import Endpoint
    from bcs_middleware.discovery.registration import gunicorn_hooks, driver_path

    when_ready, on_exit = gunicorn_hooks(
        "zk1:2181,zk2:2181",
        driver_path("BCS-MESOS-10001"),
        Endpoint(ip="10.0.0.5", port=8443, scheme="https", cluster="BCS-MESOS-10001"),
    )
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException, NoNodeError

from .base import APISERVER_DIR, DEFAULT_ROOT, DRIVER_DIR, Endpoint
from .zookeeper import make_client, start_client

log = logging.getLogger(__name__)


def driver_path(cluster_id: str, root: str = DEFAULT_ROOT) -> str:
    """The directory a Mesos driver of ``cluster_id`` registers under."""
    if not cluster_id or "/" in cluster_id:
        raise ValueError(f"bad cluster id {cluster_id!r}")
    return f"{root.rstrip('/')}/{DRIVER_DIR}/{cluster_id}"


def mesos_driver_path(root: str = DEFAULT_ROOT) -> str:
    """The directory of the Mesos cluster's own layout a driver also registers under."""
    return f"{root.rstrip('/')}/{DRIVER_DIR}"


def go_node_prefix(ip: str) -> str:
    """``_c_<guid>-<ip>``: the name go-zookeeper's protected sequential nodes get (before the sequence)."""
    return f"_c_{uuid.uuid4().hex}-{ip}"


def apiserver_path(root: str = DEFAULT_ROOT) -> str:
    """The directory a gateway (the source's "bcs-api") registers under."""
    return f"{root.rstrip('/')}/{APISERVER_DIR}"


class Registrar:
    """Keep one ephemeral sequential node for this server under ``path``.

    :param zk_hosts: kazoo hosts string.
    :param path: the directory (created if missing, persistent).
    :param endpoint: what the node says; ``hostname``/``pid`` are filled in when empty.
    :param timeout: ZooKeeper session timeout; after the process dies the node
        lingers at most this long.
    :param prefix: node name prefix before the 10-digit sequence (none by default).
    """

    def __init__(
        self,
        zk_hosts: str,
        path: str,
        endpoint: Endpoint,
        *,
        timeout: float = 10.0,
        prefix: str = "",
    ) -> None:
        if not path.startswith("/"):
            raise ValueError(f"path must be absolute, got {path!r}")
        self.hosts = zk_hosts
        self.path = path.rstrip("/")
        self.prefix = prefix
        self.timeout = timeout
        fill: dict[str, Any] = {}
        if not endpoint.hostname:
            fill["hostname"] = socket.gethostname()
        if not endpoint.pid:
            fill["pid"] = os.getpid()
        self.endpoint = dataclasses.replace(endpoint, **fill) if fill else endpoint
        self.node: str | None = None
        self._client: Any = None
        self._lock = threading.Lock()
        self._registered = threading.Event()
        self._closed = False

    def register(self, wait: float = 10.0) -> bool:
        """Connect and create the node; waits at most ``wait`` seconds for it.

        Returns whether the node exists now; if not, it is created as soon as
        ZooKeeper is reachable.
        """
        with self._lock:
            if self._client is None:
                self._client = make_client(self.hosts, self.timeout)
                self._client.add_listener(self._on_state)
                start_client(self._client)
        return self._registered.wait(wait)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: only flag and spawn, never block.
        if self._closed:
            return
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost: %s will be registered again", self.path)
            self._registered.clear()
            self.node = None
        elif state == KazooState.CONNECTED and self.node is None:
            self._client.handler.spawn(self._create)

    def _create(self) -> None:
        with self._lock:
            if self.node is not None or self._closed:
                return
            try:
                self.node = self._client.create(
                    f"{self.path}/{self.prefix}",
                    self.endpoint.to_json(),
                    ephemeral=True,
                    sequence=True,
                    makepath=True,
                )
            except KazooException as exc:
                # The connection dropped again; the next CONNECTED retries.
                log.warning("cannot register under %s: %s", self.path, type(exc).__name__)
                return
            self._registered.set()
        log.info("registered %s as %s", self.endpoint.base_url(), self.node)

    def deregister(self, wait: float = 1.0) -> None:
        """Delete the node and close the session (clean shutdown), in at most about ``2 * wait`` seconds.

        With ZooKeeper unreachable, or not answering within ``wait``, the delete cannot happen;
        the node then expires with the session, and shutting down is not held up by it: the
        session's close is then not waited for either (it would not be answered).
        """
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            node, self.node = self.node, None
        self._registered.clear()
        if client is None:
            return
        answered = client.state == KazooState.CONNECTED
        try:
            if node is not None and answered:
                client.delete_async(node).get(timeout=wait)
            elif node is not None:
                log.warning("ZooKeeper unreachable: %s expires with the session", node)
        except NoNodeError:
            pass
        except (KazooException, TimeoutError, client.handler.timeout_exception) as exc:
            # A ZooKeeper that accepts and does not answer: the handler's own timeout (kazoo's
            # threading handler raises KazooTimeoutError, neither of the others).
            answered = False
            log.warning("cannot delete %s: %s (it expires with the session)", node, type(exc).__name__)
        finally:
            # stop() waits for the connection thread, which may be in a reconnect backoff
            # when ZooKeeper is down: on a daemon thread, joined only while ZooKeeper answers.
            closer = threading.Thread(target=_close_client, args=(client,), daemon=True)
            closer.start()
            closer.join(wait if answered else 0)


def _close_client(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # closing must never raise during shutdown
        log.debug("error closing a ZooKeeper client", exc_info=True)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class RegistrationProcess:
    """The registrations of one server, held by a process of their own.

    :meth:`start` spawns ``python -m bcs_middleware.discovery.registration`` (a fresh
    interpreter: nothing of the caller's threads, greenlets or sockets) and waits up to
    ``timeout`` for every node to exist; :meth:`stop` asks it to delete them and waits
    at most ``wait`` seconds. The child watches its parent and deregisters on its own
    when the parent is gone.

    :param registrations: ``(directory, endpoint)`` pairs.
    :param go_names: name the nodes as bk-bcs's Go services do (``_c_<guid>-<ip><seq>``).
    """

    def __init__(self, zk_hosts: str, registrations: Sequence[tuple[str, Endpoint]], *,
                 timeout: float = 10.0, go_names: bool = True) -> None:
        self.spec = {
            "hosts": zk_hosts,
            "timeout": timeout,
            "go_names": go_names,
            "registrations": [{"path": path, "endpoint": json.loads(what.to_json())}
                              for path, what in registrations],
        }
        self.timeout = timeout
        self.pid: int | None = None

    def start(self) -> bool:
        """Spawn the process; returns whether every node exists within ``timeout``."""
        ready_r, ready_w = os.pipe()
        env = {**os.environ, _SPEC_ENV: json.dumps(self.spec), _PARENT_ENV: str(os.getpid())}
        try:
            # posix_spawn, not subprocess: gevent patches subprocess (and its SIGCHLD
            # handling) in a patched master; a spawn touches nothing of the caller's.
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, "-m", __name__], env,
                file_actions=[(os.POSIX_SPAWN_DUP2, ready_w, _READY_FD)])
        finally:
            os.close(ready_w)
        try:
            return _wait_readable(ready_r, self.timeout) and os.read(ready_r, 1) == b"1"
        finally:
            os.close(ready_r)

    def stop(self, wait: float = 2.0) -> None:
        """Delete the nodes (the process's clean exit); safe to call from a signal handler."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        # Polled with the original (unpatched) calls: this runs inside a signal handler of a
        # possibly gevent-patched master, where a cooperative wait may not switch.
        waitpid = _original("os", "waitpid")
        sleep = _original("time", "sleep")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                done, _ = waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by gunicorn's SIGCHLD handling
                return
            if done:
                return
            sleep(0.02)
        log.warning("the ZooKeeper registration process did not stop in %.1f s; killing it", wait)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def gunicorn_hooks(
    zk_hosts: str,
    path: str,
    endpoint: Endpoint,
    *,
    timeout: float = 10.0,
    also: Sequence[tuple[str, Endpoint]] = (),
    go_names: bool = True,
) -> tuple[Any, Any]:
    """``(when_ready, on_exit)`` gunicorn server hooks registering once per server.

    ``when_ready`` runs in the master after the sockets are bound, so the node
    only appears once the server can answer; it starts the registration process
    and wraps the master's stop signals so the nodes are deleted before gunicorn
    stops (see the module doc). ``on_exit`` removes whatever is still registered.

    :param also: further ``(directory, endpoint)`` registrations (a driver's second layout).
    :param go_names: name the nodes as bk-bcs's Go services do (``_c_<guid>-<ip><seq>``).
    """
    process = RegistrationProcess(zk_hosts, [(path, endpoint), *also], timeout=timeout, go_names=go_names)

    def when_ready(server: Any) -> None:
        if not process.start():
            log.warning("ZooKeeper not reachable yet; %s registers when it is", path)
        for signum in _STOP_SIGNALS:
            previous = signal.getsignal(signum)
            signal.signal(signum, _deregister_first(process.stop, previous))

    def on_exit(server: Any) -> None:
        process.stop()

    return when_ready, on_exit


def _deregister_first(deregister: Any, previous: Any) -> Any:
    def on_stop(signum: int, frame: Any) -> None:
        deregister()
        if callable(previous):
            previous(signum, frame)

    return on_stop


_SPEC_ENV = "BCS_REGISTRATION_SPEC"
_PARENT_ENV = "BCS_REGISTRATION_PARENT"
_READY_FD = 3
# How often the registration process checks that its parent is alive.
_PARENT_CHECK = 0.5
# Each step of a deregistration (the delete, the session's close) at most: both fit in the
# time RegistrationProcess.stop() waits (2 s) even when ZooKeeper does not answer.
_DEREGISTER_WAIT = 0.8


def _original(module: str, name: str) -> Any:
    from gevent import monkey

    return monkey.get_original(module, name)


def _wait_readable(fd: int, timeout: float) -> bool:
    import select

    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable)


def _serve_registrations() -> int:
    """The registration process: register, then hold until told to stop or orphaned."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    spec = json.loads(os.environ[_SPEC_ENV])
    parent = int(os.environ[_PARENT_ENV])
    stop = threading.Event()
    for signum in _STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    # A reload (SIGHUP to the master) keeps the registration; the terminal's hang-up too.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    registrars = []
    for item in spec["registrations"]:
        what = Endpoint.from_json(item["endpoint"])
        prefix = go_node_prefix(what.ip) if spec["go_names"] else ""
        registrars.append(Registrar(spec["hosts"], item["path"], what, timeout=spec["timeout"], prefix=prefix))
    deadline = time.monotonic() + spec["timeout"]
    registered = all([registrar.register(wait=max(0.0, deadline - time.monotonic())) for registrar in registrars])
    try:
        os.write(_READY_FD, b"1" if registered else b"0")
        os.close(_READY_FD)
    except OSError:  # the parent stopped waiting
        pass
    while not stop.wait(_PARENT_CHECK):
        if os.getppid() != parent:
            log.warning("the server is gone; deleting its ZooKeeper registration")
            break
    # All at once: a driver's two nodes share the time the server gives (RegistrationProcess.stop).
    leaving = [threading.Thread(target=registrar.deregister, kwargs={"wait": _DEREGISTER_WAIT}, daemon=True)
               for registrar in registrars]
    for thread in leaving:
        thread.start()
    deadline = time.monotonic() + 2 * _DEREGISTER_WAIT
    for thread in leaving:
        thread.join(max(0.0, deadline - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(_serve_registrations())
