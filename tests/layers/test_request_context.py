"""The access log: the JSON line's exact shape, and the background writer ``serve`` uses."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

from werkzeug.test import Client

from bcs_middleware.core import environ as env
from bcs_middleware.layers.request_context import AccessLine, RequestContextMiddleware
from bcs_middleware.telemetry.logsetup import LineWriterHandler
from tests.support.polling import wait_until


def _record(msg: object) -> logging.LogRecord:
    return logging.LogRecord("bcs_middleware.access", logging.INFO, __file__, 0, msg, (), None)


def test_access_line_is_byte_for_byte_json_dumps() -> None:
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    alphabet = 'aZ09 "\\/\x00\x1f\x7f\u00e9\u2028\U0001f600<>&\t\n'
    for _ in range(2000):
        text = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(9)]
        when = rng.uniform(0, 2e9)
        seconds = rng.uniform(0, 100)
        principal = rng.choice(["user", "agent", None])
        user = env.User(1, text[2]) if principal == "user" else None
        agent = env.ClusterAgent(text[3]) if principal == "agent" else None
        cluster = rng.choice([None, env.Cluster(text[7], "p", "k8s")])
        webhooks = tuple(text[: rng.randint(0, 3)])
        admission = rng.choice([None, env.AdmissionResult(webhooks=webhooks)])
        status, sent = rng.randint(100, 599), rng.randint(0, 10**12)
        line = str(AccessLine(when, text[0], text[1], user, agent, cluster, admission, text[4],
                              text[5], status, sent, seconds, text[6]))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(when))) + f".{int((when % 1) * 1000):03d}Z"
        expected = {
            "time": stamp, "request_id": text[0], "remote_addr": text[1],
            "user": text[2] if user else (f"cluster-agent:{text[3]}" if agent else None),
            "cluster": cluster.id if cluster else None, "method": text[4], "path": text[5],
            "status": status, "bytes": sent, "duration_ms": round(seconds * 1000, 3), "kind": text[6],
            "webhooks": list(webhooks) if admission else [],
        }
        assert line == json.dumps(expected, separators=(",", ":"))


def test_the_line_is_formatted_by_the_writer_not_the_request_thread() -> None:
    formatted_on: list[str] = []

    class Message:
        def __str__(self) -> str:
            formatted_on.append(threading.current_thread().name)
            return "lazy"

    stream = io.StringIO()
    handler = LineWriterHandler(stream)
    handler.handle(_record(Message()))
    handler.handle(_record("plain %s"))
    wait_until(lambda: stream.getvalue() == "lazy\nplain %s\n", 5, step=0.01)
    assert stream.getvalue() == "lazy\nplain %s\n"
    assert formatted_on == ["bcs-access-log"]


def test_request_threads_never_wait_for_a_write_in_progress() -> None:
    """A stuck stream blocks the writer thread only: emitting stays instant."""
    entered, release = threading.Event(), threading.Event()

    class StuckStream(io.StringIO):
        def write(self, text: str) -> int:
            entered.set()
            release.wait(10)
            return super().write(text)

    stream = StuckStream()
    handler = LineWriterHandler(stream)
    try:
        handler.handle(_record("first"))
        assert entered.wait(5), "the writer never started writing"
        started = time.monotonic()
        for n in range(1000):
            handler.handle(_record(f"line {n}"))
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
    wait_until(lambda: stream.getvalue().count("\n") >= 1001, 5, step=0.01)
    assert stream.getvalue().splitlines() == ["first", *(f"line {n}" for n in range(1000))]


def test_a_full_queue_writes_on_the_request_thread_rather_than_dropping() -> None:
    stream = io.StringIO()
    handler = LineWriterHandler(stream, max_queued=0)
    handler.handle(_record("now"))
    assert stream.getvalue() == "now\n"


def test_other_handlers_get_the_same_text_from_get_message() -> None:
    logger = logging.getLogger("bcs_middleware.access")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        app = RequestContextMiddleware(lambda environ, start: (start("204 No Content", []), [])[1])
        Client(app).get("/rest/x", headers={"X-Request-Id": "rid-1"}).close()  # close() logs
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    [line] = [json.loads(text) for text in seen]
    assert line["request_id"] == "rid-1" and line["status"] == 204 and line["kind"] == "rest"


@contextlib.contextmanager
def _sole_writer() -> Iterator[tuple[logging.Logger, LineWriterHandler, io.StringIO]]:
    """The access logger with one LineWriterHandler (as ``serve`` sets it up), restored after.

    Entered in the test's body, not in a fixture: pytest adds its capture handlers
    to the logger for each phase, and the writer must be the only one.
    """
    logger = logging.getLogger("bcs_middleware.access")
    stream = io.StringIO()
    writer = LineWriterHandler(stream)
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:] = [writer]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, writer, stream
    finally:
        logger.handlers[:], level, logger.propagate = saved
        logger.setLevel(level)


def test_bytes_and_a_single_line_for_list_and_streamed_bodies() -> None:
    closed: list[str] = []

    class Streamed:
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield b"abc"
            yield b""
            yield b"defgh"

        def close(self) -> None:
            closed.append("inner")

    bodies = {"/rest/list": [b"12", b"345"], "/rest/empty": [], "/rest/stream": Streamed()}

    def app(environ, start):  # type: ignore[no-untyped-def]
        start("200 OK", [])
        return bodies[environ["PATH_INFO"]]

    layer = RequestContextMiddleware(app)
    with _sole_writer() as (_, writer, stream):
        for path in bodies:
            body: Any = layer({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda status, headers: None)
            assert b"".join(body) in (b"12345", b"", b"abcdefgh")
            body.close()
            body.close()  # servers may close twice: logged once
        writer.drain()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["path"], line["bytes"]) for line in lines] == [
        ("/rest/list", 5), ("/rest/empty", 0), ("/rest/stream", 8)]
    assert closed == ["inner"]


def _served_lines(app: RequestContextMiddleware, stream: io.StringIO, count: int,
                  expect: int) -> list[dict[str, object]]:
    for n in range(count):
        Client(app).get(f"/rest/x{n}", headers={"X-Request-Id": f"rid-{n}"}).close()
    wait_until(lambda: stream.getvalue().count("\n") >= expect, 5, step=0.01)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_the_sole_writer_gets_lines_directly_and_filters_still_apply() -> None:
    app = RequestContextMiddleware(lambda environ, start: (start("200 OK", []), [b"ok"])[1])
    with _sole_writer() as (logger, writer, stream):
        assert LineWriterHandler.sole_handler(logger, logging.INFO) is writer
        assert [line["request_id"] for line in _served_lines(app, stream, 2, 2)] == ["rid-0", "rid-1"]
        # A filter must see records: the direct path steps aside.
        seen: list[str] = []

        def keep_odd(record: logging.LogRecord) -> bool:
            seen.append(record.getMessage())
            return json.loads(record.getMessage())["path"].endswith(("1", "3"))

        writer.addFilter(keep_odd)
        assert LineWriterHandler.sole_handler(logger, logging.INFO) is None
        stream.seek(0)
        stream.truncate()
        assert [line["path"] for line in _served_lines(app, stream, 4, 2)] == ["/rest/x1", "/rest/x3"]
        assert len(seen) == 4


def test_a_forked_child_writes_only_its_own_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    path = tmp_path / "access.log"
    with open(path, "a") as stream:
        handler = LineWriterHandler(stream)
        handler.submit("started")  # the parent's writer thread is running
        handler.drain()
        handler.submit("parent")  # queued, not yet written, when the child is forked
        pid = os.fork()
        if pid == 0:
            try:
                handler.submit("child")
                handler.drain()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        handler.drain()
    assert sorted(path.read_text().splitlines()) == ["child", "parent", "started"]
