"""A real ZooKeeper server (Debian's ``zookeeper`` package) on a free loopback port.

``ZookeeperServer`` can be stopped and started again on the same port and data
directory, so tests can take ZooKeeper away and bring it back with the
sessions and nodes it had. ``tickTime`` is short so sessions expire quickly.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

from .polling import wait_until
from .servers import ServerProcess, free_port

CLASSPATH = "/usr/share/java/*:/usr/share/zookeeper/lib/*"
JAR = Path("/usr/share/java/zookeeper.jar")


def available() -> bool:
    return JAR.exists() and shutil.which("java") is not None


class ZookeeperServer:
    """``start()``/``stop()`` a standalone ZooKeeper; ``hosts`` is the kazoo hosts string.

    :param tick_ms: ZooKeeper ``tickTime``; the smallest session timeout it
        grants is two ticks.
    """

    def __init__(self, *, tick_ms: int = 200, directory: str | None = None) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="zk-"))
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config = self.dir / "zoo.cfg"
        self.config.write_text(
            f"tickTime={tick_ms}\n"
            f"dataDir={self.dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            f"minSessionTimeout={2 * tick_ms}\n"
            f"maxSessionTimeout={100 * tick_ms}\n"
            "4lw.commands.whitelist=ruok,srvr,cons\n"
        )
        self.process: ServerProcess | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.process is not None:
            return
        self.process = ServerProcess(
            ["java", "-Xmx256m", "-cp", CLASSPATH,
             "-Dzookeeper.jmx.log4j.disable=true",
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.config)],
            port=self.port,
            answering=False,  # ZooKeeper speaks its own protocol: serving() below
            timeout=60.0,
        )
        # It listens before it serves: a client connecting in between waits for its session
        # until its own timeout (kazoo's start() raised KazooTimeoutError).
        if not wait_until(self.serving, 60, step=0.1):
            raise RuntimeError(f"ZooKeeper listens but does not serve:\n{self.output()}")

    def serving(self) -> bool:
        """ZooKeeper's ``srvr`` four-letter command names the server's mode once it serves."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(b"srvr")
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
        except OSError:
            return False
        return b"Mode:" in answer

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def output(self) -> str:
        return self.process.output() if self.process else ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
