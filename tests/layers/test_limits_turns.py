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
from bcs_middleware.telemetry import metrics

PODS = "/tunnels/clusters/BCS-K8S-T/api/v1/namespaces/default/pods"


def _app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    start_response("200 OK", [])
    yield b"{}"


def _send(layer: LimitsMiddleware, user: env.User, query: str = "") -> tuple[Any, list[str]]:
    """The layer's answer to ``user``'s ``GET pods`` (not yet read), and the statuses started."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": PODS, "QUERY_STRING": query, "wsgi.url_scheme": "https"}
    environ[env.USER] = user
    environ[env.FACTS] = facts.classify(environ)
    statuses: list[str] = []
    body = layer(environ, lambda status, headers, exc_info=None: statuses.append(status))
    return body, statuses


def _call(layer: LimitsMiddleware, user: env.User) -> str:
    body, statuses = _send(layer, user)
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


def _open(layer: LimitsMiddleware, user: env.User, query: str = "") -> Any:
    """A request whose answer is not yet closed: in flight until ``.close()``."""
    body, statuses = _send(layer, user, query)
    assert statuses == [] or statuses[0] == "200 OK"
    return body


def _turn_layer(events: list[str], turn_after: int | None = 2) -> LimitsMiddleware:
    def recorded_turn() -> bool:
        events.append("turn")
        return True  # as on a gevent worker's loop

    settings = LimitSettings(queue=QueueSettings(turn_after=turn_after))
    return LimitsMiddleware(_app, settings=settings, table=CounterTable(None), wait_turn=recorded_turn)


def _turns_counted() -> float:
    return metrics.LIMIT_QUEUED.labels("user_turn")._value.get()  # type: ignore[attr-defined]


def test_a_user_past_turn_after_waits_a_turn_for_each_more_and_a_light_user_never_does() -> None:
    events: list[str] = []
    layer = _turn_layer(events)
    counted = _turns_counted()
    bot, light = env.User(7, "bot", groups=()), env.User(8, "light", groups=())
    first, second = _open(layer, bot), _open(layer, bot, "watch=true")  # a watch counts too
    assert events == []
    third = _open(layer, bot)
    assert events == ["turn"]  # its third in flight: in its turn
    light_one = _open(layer, light)
    assert events == ["turn"]  # another user's first: at once
    fourth = _open(layer, bot)
    assert events == ["turn", "turn"]
    for body in (third, fourth, second):
        body.close()
    assert _call(layer, bot) == "200 OK"  # back to two in flight with this one: no turn
    assert events == ["turn", "turn"]
    assert _turns_counted() == counted + 2  # bcs_limits_queued_total{limit="user_turn"}
    for body in (first, light_one):
        body.close()
    assert len(layer.in_flight) == 0  # nobody left in flight: nobody kept


def test_turn_after_null_never_waits() -> None:
    events: list[str] = []
    layer = _turn_layer(events, turn_after=None)
    bot = env.User(7, "bot", groups=())
    held = [_open(layer, bot) for _ in range(5)]
    assert events == []
    for body in held:
        body.close()


def test_a_request_killed_while_waiting_its_turn_gives_back_what_it_held() -> None:
    class Killed(BaseException):
        pass

    def killed() -> None:
        raise Killed

    settings = LimitSettings(user=UserLimits(inflight=3), queue=QueueSettings(turn_after=1))
    layer = LimitsMiddleware(_app, settings=settings, table=CounterTable(None), wait_turn=killed)
    bot = env.User(7, "bot", groups=())
    first = _open(layer, bot)
    for _ in range(5):  # each killed in its wait: were its seat and count kept, the cap of 3 would refuse
        try:
            _open(layer, bot)
        except Killed:
            pass
        else:
            raise AssertionError("the turn was not waited for")
    first.close()
    assert len(layer.in_flight) == 0 and layer.queue.busy == 0
