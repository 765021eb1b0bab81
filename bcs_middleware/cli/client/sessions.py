"""``bcs-middleware sessions list`` and ``sessions play ID``: recorded exec/attach sessions.

``play`` replays a recording in the terminal with its original timing (``--speed`` to go
faster or slower, ``--idle-limit`` to shorten long pauses, as ``asciinema play -i`` does);
``--raw`` prints the output the session showed, byte for byte, without the timing. The
recording itself is asciicast v2: ``GET /rest/sessions/ID/recording`` saved to a file plays
in ``asciinema play`` unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from ...recording import asciicast
from .output import emit
from .rest import EXIT_USAGE, ClientError, GatewayClient

SESSION_COLUMNS = ("id", "cluster_id", "user", "namespace", "pod", "container", "subresource", "started_at",
                   "ended_at", "exit_code", "status")


def sessions_list(client: GatewayClient, args: argparse.Namespace) -> int:
    params = {key: value for key, value in (("cluster", args.cluster), ("user", args.user), ("since", args.since),
                                            ("until", args.until), ("limit", args.limit)) if value}
    found = client.call("GET", "/rest/sessions" + (f"?{urlencode(params)}" if params else ""))
    rows = found.get("sessions", []) if isinstance(found, dict) else []
    for row in rows:
        row["command"] = " ".join(row.get("command") or [])
    emit(rows, args.output, SESSION_COLUMNS)
    return 0


def play(lines: Any, out: BinaryIO, *, raw: bool, speed: float, idle_limit: float | None,
         sleep: Callable[[float], None] = time.sleep) -> None:
    """Write a recording's output to ``out``: at once (``raw``), or at its pace divided by ``speed``."""
    _header, events = asciicast.parse(lines)
    last = 0.0
    for event in events:
        if event.code != "o":
            continue
        if not raw:
            pause = max(event.time - last, 0.0)
            if idle_limit is not None:
                pause = min(pause, idle_limit)
            if pause > 0:
                sleep(pause / speed)
            last = event.time
        out.write(event.data.encode("utf-8"))
        if not raw:
            out.flush()
    out.flush()


def sessions_play(client: GatewayClient, args: argparse.Namespace) -> int:
    if args.speed <= 0:
        raise ClientError("--speed must be positive", exit_code=EXIT_USAGE)
    lines = client.lines(f"/rest/sessions/{quote(args.id, safe='')}/recording")
    try:
        play(lines, sys.stdout.buffer, raw=args.raw, speed=args.speed, idle_limit=args.idle_limit)
    except ValueError as exc:
        raise ClientError(f"session {args.id}: {exc}") from None
    return 0


def register(sub: Any, leaf: Callable[..., argparse.ArgumentParser], group: Callable[..., Any],
             common: argparse.ArgumentParser) -> None:
    sessions = group(sub, "sessions", "recorded kubectl exec/attach sessions (superusers, and edit holders "
                                      "of their cluster)")
    p = leaf(sessions, "list", sessions_list, "list recorded sessions, newest first", common)
    p.add_argument("--cluster", help="only this cluster's")
    p.add_argument("--user", help="only this user's")
    p.add_argument("--since", metavar="TIME", help="only sessions still running at or after this RFC 3339 time")
    p.add_argument("--until", metavar="TIME", help="only sessions started at or before this RFC 3339 time")
    p.add_argument("--limit", type=int, help="at most this many (default 100)")
    p = leaf(sessions, "play", sessions_play, "replay a recorded session in the terminal", common)
    p.add_argument("id", help="the session's id (see sessions list)")
    p.add_argument("--speed", type=float, default=1.0, help="play this many times faster (default 1)")
    p.add_argument("--idle-limit", type=float, metavar="SECONDS",
                   help="shorten any pause to at most this long")
    p.add_argument("--raw", action="store_true",
                   help="print the session's output at once, byte for byte, without the timing")
