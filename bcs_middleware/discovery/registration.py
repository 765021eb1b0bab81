"""Self-registration in ZooKeeper: an ephemeral sequential node per server.

:class:`Registrar` writes ``Endpoint.to_json()`` as an ephemeral sequential
node under a directory of the source layout (drivers under
``{root}/mesosdriver/{cluster_id}/``, gateways under ``{root}/apiserver/``),
writes it again after a session expiry removed it, and deletes it on a clean
shutdown. The node disappears by itself when the process dies (its session
ends), which is what lets gateways stop routing to a dead driver.

Under gunicorn there must be one registration per *server*, not per worker:
:func:`gunicorn_hooks` returns ``when_ready``/``on_exit`` hooks that register in
the master process. Example ``gunicorn.conf.py``::

    from bcs_middleware.discovery import Endpoint
    from bcs_middleware.discovery.registration import gunicorn_hooks, driver_path

    when_ready, on_exit = gunicorn_hooks(
        "zk1:2181,zk2:2181",
        driver_path("BCS-MESOS-10001"),
        Endpoint(ip="10.0.0.5", port=8443, scheme="https", cluster="BCS-MESOS-10001"),
    )
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
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

    def deregister(self) -> None:
        """Delete the node and close the session (clean shutdown)."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            node, self.node = self.node, None
        self._registered.clear()
        if client is None:
            return
        try:
            if node is not None:
                client.delete(node)
        except NoNodeError:
            pass
        except KazooException as exc:
            log.warning("cannot delete %s: %s (it expires with the session)", node, type(exc).__name__)
        finally:
            client.stop()
            client.close()


def gunicorn_hooks(
    zk_hosts: str, path: str, endpoint: Endpoint, *, timeout: float = 10.0
) -> tuple[Any, Any]:
    """``(when_ready, on_exit)`` gunicorn server hooks registering once per server.

    ``when_ready`` runs in the master after the sockets are bound, so the node
    only appears once the server can answer; ``on_exit`` removes it.
    """
    holder: dict[str, Registrar] = {}

    def when_ready(server: Any) -> None:
        registrar = Registrar(zk_hosts, path, endpoint, timeout=timeout)
        holder["registrar"] = registrar
        if not registrar.register(wait=timeout):
            log.warning("ZooKeeper not reachable yet; %s registers when it is", path)

    def on_exit(server: Any) -> None:
        registrar = holder.pop("registrar", None)
        if registrar is not None:
            registrar.deregister()

    return when_ready, on_exit
