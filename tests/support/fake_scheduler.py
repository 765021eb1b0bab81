"""A stand-in for the Mesos scheduler (or a driver): records requests, answers JSON.

Threaded werkzeug server on 127.0.0.1, optionally over TLS. Each answer says
which instance served it, so tests can see where a request went.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import make_server


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeScheduler:
    """``FakeScheduler("s1")``; ``requests`` holds what reached it; ``stop()`` when done."""

    def __init__(self, name: str, *, ssl_context: ssl.SSLContext | None = None, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True, ssl_context=ssl_context)
        self.port = self.server.server_port
        self.scheme = "https" if ssl_context else "http"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        record = Recorded(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                          environ.get("QUERY_STRING", ""), headers, body)
        with self._lock:
            self.requests.append(record)
        payload = json.dumps({"served_by": self.name, "path": record.path, "query": record.query,
                              "body": record.json() if headers.get("Content-Type", "").startswith(
                                  "application/json") and body else None}).encode()
        start_response(f"{self.status} X", [("Content-Type", "application/json"),
                                            ("Content-Length", str(len(payload)))])
        return [payload]

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.server.shutdown()
            self.server.server_close()
