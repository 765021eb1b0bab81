"""Recorded exec/attach sessions: listed, described and served (issue 28).

``GET /rest/sessions`` (query ``cluster``, ``user``, ``since``, ``until`` as RFC 3339 times,
``limit``), ``GET /rest/sessions/{id}`` and ``GET /rest/sessions/{id}/recording`` (the
asciicast v2 file, ``application/x-asciicast``, as ``asciinema play`` takes it). A superuser
sees every session; anyone else the sessions of the clusters they hold ``edit`` on — a
recording shows what was typed and printed in a cluster, which is the cluster's editors' to
read. A session on a cluster the caller may not edit is a 404, as if it did not exist.
"""

from __future__ import annotations

from datetime import UTC, datetime

from werkzeug.wrappers import Response

from ...clusters.permissions import EDIT
from ...core import environ as env
from ...core.errors import BadRequest, NotFound
from ...recording.catalog import SessionInfo, SessionQuery, SessionReader
from .calls import Ctx, json_response

MAX_LIMIT = 1000


def _recordings(ctx: Ctx) -> SessionReader:
    if ctx.recordings is None:
        raise NotFound("session recording is not configured on this gateway", code_name="SESSIONS_NOT_CONFIGURED")
    return ctx.recordings


def _time(ctx: Ctx, name: str) -> datetime | None:
    value = ctx.request.args.get(name)
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{name}: expected an RFC 3339 time such as 2026-11-28T05:00:00Z",
                         code_name="INVALID_QUERY") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _editable(ctx: Ctx, user: env.User) -> frozenset[str] | None:
    """The clusters whose sessions ``user`` may read (``None``: all, a superuser)."""
    if user.is_superuser:
        return None
    return frozenset(cluster.id for cluster, permission in ctx.access.visible(user) if permission == EDIT)


def list_sessions(ctx: Ctx) -> Response:
    user = ctx.require_user()
    store = _recordings(ctx)
    cluster = ctx.request.args.get("cluster") or None
    if cluster is not None:
        ctx.require_cluster(cluster, EDIT)
    try:
        limit = int(ctx.request.args.get("limit", "100"))
    except ValueError:
        raise BadRequest("limit: expected a number", code_name="INVALID_QUERY") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit: expected 1 to {MAX_LIMIT}", code_name="INVALID_QUERY")
    query = SessionQuery(cluster_id=cluster, user=ctx.request.args.get("user") or None,
                         since=_time(ctx, "since"), until=_time(ctx, "until"),
                         clusters=_editable(ctx, user), limit=limit)
    return json_response({"sessions": [info.as_json() for info in store.sessions(query)]})


def _session(ctx: Ctx, session_id: str) -> tuple[SessionReader, SessionInfo]:
    user = ctx.require_user()
    store = _recordings(ctx)
    info = store.get(session_id)
    allowed = _editable(ctx, user)
    if info is None or (allowed is not None and info.cluster_id not in allowed):
        raise NotFound(f"session {session_id!r} not found", code_name="SESSION_NOT_FOUND")
    return store, info


def get_session(ctx: Ctx, session_id: str) -> Response:
    _store, info = _session(ctx, session_id)
    return json_response(info.as_json())


def get_recording(ctx: Ctx, session_id: str) -> Response:
    store, info = _session(ctx, session_id)
    try:
        pieces = store.read(info.id)
    except OSError:
        raise NotFound(f"session {session_id!r} has no recording", code_name="SESSION_NOT_FOUND") from None
    response = Response(pieces, mimetype="application/x-asciicast", direct_passthrough=True)
    response.headers["Content-Disposition"] = f'attachment; filename="{info.id}.cast"'
    response.headers["Cache-Control"] = "no-store"
    return response
