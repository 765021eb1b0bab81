"""Keep-alive clients that send requests back to back to a real gateway, and what each one saw.

Each client holds one HTTPS keep-alive connection and never reconnects: a request without a
complete answer ends it (``failure``), and so does an answer saying ``Connection: close``
(``told_close_after``). Even clients list the clusters (``GET /rest/clusters/``), odd ones
register a new cluster each time (``POST /rest/clusters/bcs``), unless ``kinds`` says otherwise.
Used by ``tests/serving/test_keepalive.py`` and ``bench/keepalive_soak.py``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .gateway import ADMIN, Gateway


@dataclass
class ClientRun:
    """What one keep-alive client saw."""

    number: int
    kind: str  # "get" or "post"
    prefix: str = "BCS-K8S-KA"
    answered: int = 0
    created: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    #: a request that got no complete answer, or a wrong status, and when (seconds into the load)
    failure: str | None = None
    #: the server announced the end of the connection (``Connection: close``) at this answer
    told_close_after: int | None = None
    #: the cluster a registration without an answer would have created, and how long after the
    #: previous answer that request was sent
    unanswered: str | None = None
    unanswered_after: float | None = None
    last_answer: float = 0.0
    conn: http.client.HTTPSConnection | None = None


def run_client(gw: Gateway, run: ClientRun, until: float, stop: threading.Event, started: float) -> None:
    """Requests back to back on one connection until ``until`` (or ``stop``); never reconnects."""
    context = ssl.create_default_context(cafile=gw.ca_file)
    conn = run.conn = http.client.HTTPSConnection("localhost", gw.server.port, context=context, timeout=60)
    conn.connect()
    sock = conn.sock
    auth = {"Authorization": f"Bearer {ADMIN}"}
    while time.monotonic() < until and not stop.is_set():
        cluster = f"{run.prefix}{run.number:02d}{run.answered:07d}"
        sent = time.monotonic()
        try:
            if run.kind == "post":
                conn.request("POST", "/rest/clusters/bcs", headers={**auth, "Content-Type": "application/json"},
                             body=json.dumps({"id": cluster, "project_id": "keepalive", "cluster_type": "k8s"}))
            else:
                conn.request("GET", "/rest/clusters/", headers=auth)
            response = conn.getresponse()
            body = response.read()
        except (http.client.HTTPException, OSError) as exc:
            run.failure = (f"{sent - started:.1f}s: request {run.answered + 1} unanswered "
                           f"({type(exc).__name__}: {exc})")
            run.unanswered = cluster if run.kind == "post" else None
            run.unanswered_after = sent - run.last_answer if run.answered else None
            return
        run.last_answer = time.monotonic()
        run.latencies.append(run.last_answer - sent)
        if not response.will_close and conn.sock is not sock:
            run.failure = "http.client opened another connection"
            return
        expected = 201 if run.kind == "post" else 200
        if response.status != expected:
            run.failure = f"{sent - started:.1f}s: request {run.answered + 1}: HTTP {response.status} {body[:200]!r}"
            return
        run.answered += 1
        if run.kind == "post":
            run.created.append(cluster)
        if response.will_close:
            run.told_close_after = run.answered
            return


class Load:
    """``clients`` keep-alive clients on threads of their own, for ``seconds`` or until :meth:`stop`."""

    def __init__(self, gw: Gateway, seconds: float, *, clients: int = 8,
                 kinds: Sequence[str] = ("get", "post"), prefix: str = "BCS-K8S-KA") -> None:
        self.runs = [ClientRun(number, kinds[number % len(kinds)], prefix) for number in range(clients)]
        self._stop = threading.Event()
        self.started = time.monotonic()
        until = self.started + seconds
        self._threads = [threading.Thread(target=run_client, args=(gw, run, until, self._stop, self.started))
                         for run in self.runs]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> list[ClientRun]:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(thread.is_alive() for thread in self._threads), "a client hangs"
        return self.runs

    def close(self) -> None:
        self.stop()
        for run in self.runs:
            if run.conn is not None:
                run.conn.close()

    def created(self) -> set[str]:
        """The clusters the server answered 201 for."""
        return {cluster for run in self.runs for cluster in run.created}
