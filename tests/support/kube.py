"""Run the real kubectl (every installed version) against a server, from tests.

kubectl is the google-cloud-sdk build: ``kubectl`` on PATH plus ``kubectl.1.27`` …
``kubectl.1.33`` beside it (found through the symlink). Every run gets its own ``HOME`` in a
temp dir (kubectl writes its discovery cache there, which must not leak between tests) and a
``--request-timeout``, so no test can hang on a silent server.
"""

from __future__ import annotations

import base64
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import yaml

DEFAULT_VERSION = "1.32"


def kubectl_path(version: str | None = None) -> str | None:
    """The kubectl binary for ``version`` (``"1.27"``), or the default one; None if missing."""
    found = shutil.which("kubectl")
    if found is None:
        return None
    if version is None:
        return found
    candidate = Path(os.path.realpath(found)).parent / f"kubectl.{version}"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def kubectl_versions() -> list[str]:
    """The installed versioned kubectl binaries, e.g. ``["1.27", …, "1.33"]``, oldest first."""
    found = shutil.which("kubectl")
    if found is None:
        return []
    folder = Path(os.path.realpath(found)).parent
    versions = [p.name.removeprefix("kubectl.") for p in folder.glob("kubectl.1.*")]
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def write_kubeconfig(path: str | os.PathLike[str], *, server: str, token: str,
                     ca_pem: str | bytes | None = None, ca_file: str | None = None,
                     context: str = "test", tls_server_name: str | None = None,
                     namespace: str = "default") -> Path:
    """Write a single-context kubeconfig with a bearer token; returns its path."""
    cluster: dict[str, str] = {"server": server}
    if ca_pem is not None:
        data = ca_pem.encode() if isinstance(ca_pem, str) else ca_pem
        cluster["certificate-authority-data"] = base64.b64encode(data).decode()
    elif ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context,
                      "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
    }
    target = Path(path)
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target


def _argv(args: Sequence[str], kubeconfig: str | os.PathLike[str], version: str | None,
          request_timeout: float) -> list[str]:
    binary = kubectl_path(version)
    if binary is None:
        raise FileNotFoundError(f"kubectl {version or ''} is not installed")
    return [binary, f"--kubeconfig={kubeconfig}", f"--request-timeout={request_timeout:g}s",
            *args]


def _env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(HOME=home, KUBECACHEDIR=str(Path(home) / "cache"), NO_PROXY="*", no_proxy="*")
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env.pop(name, None)
    return env


def kubectl(*args: str, kubeconfig: str | os.PathLike[str], version: str | None = None,
            timeout: float = 30, input: str | None = None,
            request_timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run kubectl once; returns the finished process (check ``returncode`` yourself)."""
    with tempfile.TemporaryDirectory(prefix="kubectl-home-") as home:
        return subprocess.run(
            _argv(args, kubeconfig, version, request_timeout), capture_output=True, text=True,
            timeout=timeout, input=input, env=_env(home), check=False,
        )


class KubectlWatch:
    """A running ``kubectl … --watch``: read its output line by line with deadlines.

    A reader thread moves stdout lines into a queue so :meth:`wait_for` never blocks past its
    deadline; :meth:`stop` terminates kubectl (bounded) and returns what it printed on stderr.
    """

    def __init__(self, argv: list[str], env: dict[str, str],
                 home: tempfile.TemporaryDirectory[str]) -> None:
        self._home = home
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,),
                                        daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 15) -> str:
        """The first new line containing ``text``; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                raise EOFError(f"kubectl exited before printing {text!r}: {self.lines}")
            self.lines.append(line)
            if text in line:
                return line
        raise TimeoutError(f"no line with {text!r} within {timeout}s: {self.lines}")

    def stop(self, timeout: float = 5) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        self._reader.join(timeout)
        self._home.cleanup()
        return stderr

    def __enter__(self) -> KubectlWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kubectl_watch(*args: str, kubeconfig: str | os.PathLike[str], version: str | None = None,
                  request_timeout: float = 60) -> KubectlWatch:
    """Start ``kubectl *args`` (include ``--watch``) in the background; use as a context manager.

    ``request_timeout`` defaults to 0 (none) because kubectl applies it to the watch stream
    itself; the caller bounds the wait with :meth:`KubectlWatch.wait_for` instead.
    """
    home = tempfile.TemporaryDirectory(prefix="kubectl-home-")
    argv = _argv(args, kubeconfig, version, request_timeout)
    return KubectlWatch(argv, _env(home.name), home)
