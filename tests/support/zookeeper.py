"""A real ZooKeeper server (Debian's ``zookeeper`` package) on a free loopback port.

``ZookeeperServer`` can be stopped and started again on the same port and data
directory, so tests can take ZooKeeper away and bring it back with the
sessions and nodes it had. ``tickTime`` is short so sessions expire quickly.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

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
            answering=False,  # ZooKeeper speaks its own protocol: its port is its readiness
            timeout=60.0,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def output(self) -> str:
        return self.process.output() if self.process else ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
