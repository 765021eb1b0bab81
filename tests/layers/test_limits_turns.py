"""A refusal is answered in its turn of the worker's loop (``core/turns.py``), an admitted request
is not held: in-process, the layer with its collaborators given (the turn recorded, no sleep).

Served, under load: ``bench/fairness_bench.py`` (bench/README.md, "Handshakes and refusals in
their turn").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bcs_middleware.core import environ as env
from bcs_middleware.core import facts
from bcs_middleware.layers.limits import LimitsMiddleware
from bcs_middleware.limits.settings import LimitSettings, QueueSettings, UserLimits
from bcs_middleware.limits.table import CounterTable

PODS = "/tunnels/clusters/BCS-K8S-T/api/v1/namespaces/default/pods"


def _app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    start_response("200 OK", [])
    yield b"{}"


def _call(layer: LimitsMiddleware, user: env.User) -> str:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": PODS, "QUERY_STRING": "", "wsgi.url_scheme": "https"}
    environ[env.USER] = user
    environ[env.FACTS] = facts.classify(environ)
    statuses: list[str] = []
    body = layer(environ, lambda status, headers, exc_info=None: statuses.append(status))
    b"".join(body)
    getattr(body, "close", lambda: None)()
    return statuses[0]


def test_a_refusal_waits_for_its_turn_and_an_admitted_request_does_not() -> None:
    events: list[str] = []
    settings = LimitSettings(user=UserLimits(rate=0.001, burst=2), queue=QueueSettings(refusal_delay=1.0))
    layer = LimitsMiddleware(_app, settings=settings, table=CounterTable(None),
                             sleep=lambda seconds: events.append("delay"), delay_refusals=lambda: True,
                             wait_turn=lambda: events.append("turn"))
    user = env.User(7, "bot", groups=())
    assert [_call(layer, user) for _ in range(2)] == ["200 OK", "200 OK"]
    assert events == []
    assert _call(layer, user).startswith("429")
    assert events == ["delay", "turn"]  # the delay first, then its turn
