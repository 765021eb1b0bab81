"""Real receivers of exported audit events for tests: an HTTPS webhook that can go down and come
back on the same port, and a real rsyslog from Debian (imtcp, plain or TLS through ``gtls``)
writing what it receives to a file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from werkzeug.serving import BaseWSGIServer, make_server

from tests.support.polling import wait_for
from tests.support.servers import free_port, wait_for_port


class WebhookReceiver:
    """An ``audit.k8s.io/v1`` ``EventList`` receiver on HTTPS (a trustme certificate for
    ``localhost``), requiring a bearer token; :meth:`down` closes its socket (connections are
    refused), :meth:`up` listens on the same port again."""

    def __init__(self, token: str = "siem-token-0123456789abcdef") -> None:
        self.token = token
        self.ca = trustme.CA()
        self.port = free_port()
        self.events: list[dict[str, Any]] = []
        self.posts = 0
        self.status = 200  # what a POST is answered (the events are kept only on a 2xx)
        self._lock = threading.Lock()
        self._server: BaseWSGIServer | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="audit-webhook-")
        pem = Path(self._tmp.name) / "server.pem"
        self.ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(str(pem))

    def app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if environ.get("HTTP_AUTHORIZATION") != f"Bearer {self.token}":
            start_response("401 Unauthorized", [("Content-Type", "application/json")])
            return [b"{}"]
        document = json.loads(body)
        assert document["kind"] == "EventList" and document["apiVersion"] == "audit.k8s.io/v1"
        with self._lock:
            self.posts += 1
            status = self.status
            if 200 <= status < 300:
                self.events.extend(document["items"])
        start_response(f"{status} X", [("Content-Type", "application/json")])
        return [b"{}"]

    def up(self) -> None:
        self._server = make_server("127.0.0.1", self.port, self.app, threaded=True, ssl_context=self._context)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for ``--audit-webhook-config-file`` (inline CA, the token)."""
        import base64

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "siem",
            "clusters": [{"name": "siem", "cluster": {
                "server": f"https://localhost:{self.port}/audit",
                "certificate-authority-data": base64.b64encode(self.ca.cert_pem.bytes()).decode()}}],
            "users": [{"name": "gateway", "user": {"token": self.token}}],
            "contexts": [{"name": "siem", "context": {"cluster": "siem", "user": "gateway"}}],
        }))
        return path

    def close(self) -> None:
        self.down()
        self._tmp.cleanup()


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    receiver.up()
    try:
        yield receiver
    finally:
        receiver.close()


RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"


def need_rsyslog(tls: bool = False) -> None:
    """Skip (a failure under CI=true) without Debian's rsyslog (and rsyslog-gnutls for TLS)."""
    if not os.path.exists(RSYSLOGD):
        pytest.skip("rsyslog is not installed (apt-get install rsyslog)")
    if tls and not any(Path(d).glob("lmnsd_gtls.so") for d in ("/usr/lib/x86_64-linux-gnu/rsyslog",
                                                                "/usr/lib/aarch64-linux-gnu/rsyslog",
                                                                "/usr/lib/rsyslog")):
        pytest.skip("rsyslog's gtls driver is not installed (apt-get install rsyslog-gnutls)")


class Rsyslog:
    """A real ``rsyslogd -n`` with its own configuration: ``imtcp`` on a free loopback port
    (TLS with ``gtls`` and a trustme certificate when ``tls``), every message written raw
    (``RSYSLOG_SyslogProtocol23Format``, RFC 5424 as received) to ``out``."""

    def __init__(self, folder: Path, *, tls: bool, ca: trustme.CA | None = None,
                 client_ca: trustme.CA | None = None) -> None:
        self.folder = folder
        self.tls = tls
        self.port = free_port()
        self.out = folder / "messages.log"
        self.ca = ca or trustme.CA()
        conf = folder / "rsyslog.conf"
        lines = [
            f'global(workDirectory="{folder}" maxMessageSize="128k"',
        ]
        if tls:
            cert = self.ca.issue_cert("localhost", "127.0.0.1")
            cert.cert_chain_pems[0].write_to_path(str(folder / "server.crt"))
            cert.private_key_pem.write_to_path(str(folder / "server.key"))
            self.ca.cert_pem.write_to_path(str(folder / "ca.crt"))
            trusted = client_ca or self.ca
            trusted.cert_pem.write_to_path(str(folder / "client-ca.crt"))
            lines[0] += (f' defaultNetstreamDriver="gtls" defaultNetstreamDriverCAFile="{folder}/client-ca.crt"'
                         f' defaultNetstreamDriverCertFile="{folder}/server.crt"'
                         f' defaultNetstreamDriverKeyFile="{folder}/server.key"')
        lines[0] += ")"
        if tls:
            mode = '"x509/certvalid"' if client_ca is not None else '"anon"'
            lines.append(f'module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1" '
                         f'streamDriver.authMode={mode})')
        else:
            lines.append('module(load="imtcp")')
        lines += [
            f'input(type="imtcp" port="{self.port}" address="127.0.0.1")',
            f'action(type="omfile" file="{self.out}" template="RSYSLOG_SyslogProtocol23Format")',
        ]
        conf.write_text("\n".join(lines) + "\n")
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.folder / "rsyslogd.out", "ab") as log:
            self.proc = subprocess.Popen(
                [RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.folder / "rsyslogd.pid")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_port("127.0.0.1", self.port, 20, self.proc)  # type: ignore[arg-type]
        except Exception:
            self.stop()
            raise RuntimeError(f"rsyslogd did not start:\n{self.output()}") from None

    def output(self) -> str:
        """What rsyslogd printed (its errors)."""
        try:
            return (self.folder / "rsyslogd.out").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def lines(self) -> list[str]:
        try:
            return [line for line in self.out.read_text(errors="replace").splitlines() if line]
        except FileNotFoundError:
            return []

    def messages(self, count: int, timeout: float = 60.0) -> list[str]:
        """The first ``count`` messages once that many were written (rsyslog flushes its file
        per message batch)."""
        return wait_for(lambda: (lines := self.lines()) and len(lines) >= count and lines, timeout,
                        f"rsyslog did not write {count} messages")[:count]
