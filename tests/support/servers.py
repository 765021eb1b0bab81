"""Start real servers (gunicorn, anything else) on loopback for a test, and stop them."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.support.polling import wait_until

BIN = Path(sys.executable).parent


#: Under pytest-xdist (``tox``'s default run) each worker process takes the ports it hands out
#: from its own block, below the kernel's ephemeral range (where ``bind(0)`` and outgoing
#: connections take theirs): a port one worker found free cannot be handed to another worker
#: before the first one's server has bound it. In one block ports are handed out in turn, so a
#: test asking for two before it binds either never gets the same one twice.
_FIRST_PORT = 12000
_PORTS_PER_WORKER = 2000
_MAX_WORKERS = 10  # 12000 + 10 * 2000 = 32000, below the ephemeral range (32768)


def _worker_block() -> int | None:
    """The first port of this xdist worker's block (``None``: not under xdist, the kernel picks)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under xdist
    if not worker.startswith("gw") or not worker[2:].isdigit() or int(worker[2:]) >= _MAX_WORKERS:
        return None
    return _FIRST_PORT + int(worker[2:]) * _PORTS_PER_WORKER


_block = _worker_block()
# A C-level counter (safe from several threads), started by the process id so a rerun does not
# retrace the last run's ports, some of which may still linger.
_turn = itertools.count(os.getpid() % _PORTS_PER_WORKER)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (from this worker's block under pytest-xdist)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(_PORTS_PER_WORKER):
        port = 0 if _block is None else _block + next(_turn) % _PORTS_PER_WORKER
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                continue  # in use (or lingering) here: the next one
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port in this worker's block on {host}")


def wait_for_port(host: str, port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


#: What :func:`wait_until_answering` sends: a request line gunicorn's parser refuses (a method
#: is a token, RFC 9110 §9.1, and ``?`` is not a token character), so the worker answers ``400``
#: itself and the application never sees the probe: no access-log line, metric or upstream call.
_PROBE = b"READY? / HTTP/1.1\r\nHost: probe\r\n\r\n"


def answers(host: str, port: int, *, tls: bool, timeout: float = 5.0) -> bool:
    """Whether a worker of the server at ``host:port`` takes a connection and answers it.

    A gunicorn worker loads its application before it accepts (``Worker.init_process``), and
    the port is open earlier (the master binds it; a connection then waits in the kernel's
    queue), so an answer means the application is loaded. Over TLS a refused handshake (a
    server that requires a client certificate) is an answer too. Nothing here verifies the
    server: the probe only asks whether anyone is there.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            if not tls:
                raw.sendall(_PROBE)
                raw.recv(64)
                return True
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with ctx.wrap_socket(raw) as sock:
                sock.sendall(_PROBE)
                sock.recv(64)
                return True
    except ssl.SSLError:
        return True
    except (TimeoutError, ConnectionRefusedError):
        return False
    except OSError:  # reset or closed by the worker: it took the connection
        return True


def wait_until_answering(host: str, port: int, *, tls: bool, timeout: float = 60.0,
                         proc: subprocess.Popen | None = None) -> None:
    """:func:`wait_for_port`, then poll until a worker answers (:func:`answers`): under load
    an application's imports take seconds after the port opens."""
    deadline = time.monotonic() + timeout
    wait_for_port(host, port, timeout, proc)

    def answered() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        return answers(host, port, tls=tls, timeout=max(0.5, min(5.0, deadline - time.monotonic())))

    if not wait_until(answered, max(0.0, deadline - time.monotonic()), step=0.05):
        raise TimeoutError(f"{host}:{port} accepted connections but no worker answered in {timeout}s")


class ServerProcess:
    """A child process serving on ``host:port``; output captured in a temp file.

    With ``wait`` the constructor returns once the server answers (``answering``, for HTTP
    servers: see :func:`answers`) or only listens (``answering=False``, for other protocols),
    within ``timeout`` seconds.

    ``output()`` returns what it printed so far (tests check log hygiene with it).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        scheme: str = "http",
        wait: bool = True,
        answering: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.host, self.port, self.scheme = host, port, scheme
        self._log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)  # noqa: SIM115
        self._final_output: str | None = None  # kept at stop(), when the file is removed
        full_env = {**os.environ, **(env or {})}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        if wait:
            try:
                if answering:
                    wait_until_answering(host, port, tls=scheme == "https", timeout=timeout, proc=self.proc)
                else:
                    wait_for_port(host, port, timeout, self.proc)
            except Exception:
                self.stop()
                raise RuntimeError(f"server did not start: {argv}\n{self.output()}") from None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def output(self) -> str:
        if self._final_output is not None:
            return self._final_output
        return Path(self._log.name).read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._final_output is None and self.proc.poll() is not None:
            self._final_output = self.output()
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: ``bcs-middleware serve``'s default worker class (``cli/main.py``), the one the suites run under.
SERVE_DEFAULT_WORKER_CLASS = "gevent"
#: The worker classes ``serve`` runs (``cli/serve_config.py``); gunicorn names them the same.
SUPPORTED_WORKER_CLASSES = ("gevent", "gthread")


def worker_class_under_test() -> str:
    """The gunicorn worker class every server a test starts runs on, unless the test names one.

    ``serve``'s default (gevent), or the other with ``BCS_TEST_WORKER_CLASS=gthread`` (``tox -e
    gthread``): everything must work unchanged on both. The one place the choice is made.
    """
    chosen = os.environ.get("BCS_TEST_WORKER_CLASS") or SERVE_DEFAULT_WORKER_CLASS
    if chosen not in SUPPORTED_WORKER_CLASSES:
        raise ValueError(f"BCS_TEST_WORKER_CLASS={chosen!r}: serve runs {' or '.join(SUPPORTED_WORKER_CLASSES)}")
    return chosen


def gunicorn(
    app_or_paste: str,
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    workers: int = 1,
    worker_class: str | None = None,
    threads: int = 8,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    timeout: float = 60.0,
) -> ServerProcess:
    """Run ``gunicorn`` on loopback serving ``module:app`` or ``--paste FILE.ini``.

    Always passes ``--no-control-socket``: gunicorn 27 otherwise binds one
    fixed path under ``~/.gunicorn`` and side-by-side servers fight over it. ``worker_class``
    defaults to :func:`worker_class_under_test`.
    """
    port = port or free_port(host)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    argv = [
        str(BIN / "gunicorn"),
        "--bind", bind,
        "--workers", str(workers),
        "--worker-class", worker_class or worker_class_under_test(),
        "--threads", str(threads),
        "--no-control-socket",
        "--graceful-timeout", "5",
        "--log-level", "info",
    ]
    scheme = "http"
    if certfile:
        argv += ["--certfile", certfile, "--keyfile", keyfile or certfile]
        scheme = "https"
    argv += list(extra)
    if app_or_paste.endswith(".ini"):
        argv += ["--paste", app_or_paste]
    else:
        argv.append(app_or_paste)
    return ServerProcess(argv, host=host, port=port, env=env, scheme=scheme, timeout=timeout)


def http_get(url: str, *, headers: dict[str, str] | None = None, cafile: str | None = None,
             timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """A plain stdlib GET returning (status, headers, body) for any status."""
    ctx = ssl.create_default_context(cafile=cafile) if url.startswith("https") else None
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


class ConnectionServer:
    """A loopback TCP listener whose thread hands each accepted connection to :meth:`handle`,
    on a thread of its own; ``accepted`` counts them, :meth:`close` stops listening.

    Subclasses set their own attributes before calling ``super().__init__()`` (the accepting
    thread starts there).
    """

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class TrapListener:
    """A TCP listener on loopback that counts the connections it accepts (``accepted``).

    Each accepted connection is answered ``answer`` after the first read (if given), held open
    until :meth:`close` (``hold=True``: a peer that accepts and says nothing), or closed at once.
    ``port``: listen on this one (default: a free one).
    """

    def __init__(self, host: str = "127.0.0.1", *, answer: bytes = b"", hold: bool = False, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family)
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.answer = answer
        self.hold = hold
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.hold:
                self._held.append(conn)
                continue
            with conn:
                if self.answer:
                    conn.settimeout(2)
                    try:
                        conn.recv(4096)
                        conn.sendall(self.answer)
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self.sock.close()
