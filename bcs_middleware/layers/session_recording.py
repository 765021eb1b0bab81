"""Record ``kubectl exec`` and ``attach`` sessions (``kubectl debug`` attaches too) as asciicast v2.

The layer sits right in front of the proxy (after cluster routing and admission), so the user,
the cluster and the connect options as they go upstream are known. For an exec/attach upgrade
on a cluster whose policy (:class:`~bcs_middleware.recording.settings.RecordingSettings`) is
``on`` or ``required`` it creates the recording *before* anything is sent upstream: under
``required`` a recording that cannot be created refuses the session with a ``503`` Kubernetes
``Status`` (fail closed); under ``on`` the session goes on unrecorded and the failure is
counted. Once the apiserver answered ``101`` the splice's bytes go to the recording through a
tap (:class:`~bcs_middleware.core.splice.SpliceTap`) — a bounded buffer, never a blocking
write (:mod:`bcs_middleware.recording.recorder`). Every transport the proxy splices is
recorded the same way: WebSocket ``v4``/``v5.channel.k8s.io`` and SPDY/3.1, to an apiserver
reached directly or through an agent tunnel.

Reads ``bcs.facts`` (the upgrade, the exec/attach classification), ``bcs.user``,
``bcs.cluster``, ``bcs.upstream`` (the connect options sent). Sets ``bcs.session`` (the
session as it ended, with its recording id and exit status) when the stream closes, for the
audit layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.errors import ConfigError, ServiceUnavailable
from ..recording import settings as recording_options
from ..recording import websocket
from ..recording.catalog import RecordingStore, RecordingUnavailable, SessionInfo, describe
from ..recording.recorder import Recording, SessionRecorder
from ..recording.settings import RecordingSettings
from ..telemetry import metrics

__all__ = ["SessionRecordingMiddleware", "filter_factory", "session_of"]

RECORDED = ("exec", "attach")


def session_of(environ: dict[str, Any], started_at: datetime) -> SessionInfo | None:
    """The exec/attach session a request opens, from its facts (``None``: not one)."""
    facts = request_facts.of(environ)
    info = facts.info
    if facts.upgrade is None or not info.connect or info.connect_subresource not in RECORDED:
        return None
    user = env.get_user(environ)
    cluster = env.get_cluster(environ)
    upstream = env.get_upstream(environ)
    return describe(
        info, cluster_id=cluster.id if cluster is not None else facts.cluster_id or "",
        user=user.name if user is not None else "system:anonymous",
        groups=("system:authenticated", *user.groups) if user is not None else ("system:unauthenticated",),
        query=upstream.query if upstream is not None else str(environ.get("QUERY_STRING", "")),
        transport="spdy" if facts.upgrade.lower().startswith("spdy") else "websocket", started_at=started_at,
    )


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k.lower() == name), "")


class _RecordedBody:
    """The ``101``'s body: the splice runs through it; closing it finishes the recording."""

    def __init__(self, body: Any, on_close: Any) -> None:
        self._body = body
        self._on_close = on_close

    @property
    def result(self) -> Any:
        return getattr(self._body, "result", None)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._on_close(self.result)


class SessionRecordingMiddleware:
    """Record exec/attach sessions per the recording policy of their cluster.

    :param app: the proxy (the terminal app that answers upgrades with
        :class:`~bcs_middleware.apps.upgrade.UpgradedStream`).
    :param recorder: the policy, the store and the writer.

    Example (the gateway composition builds it from ``record*`` settings)::

        SessionRecordingMiddleware(proxy, recorder=SessionRecorder(DirectoryStore(path), settings))
    """

    def __init__(self, app: Any, *, recorder: SessionRecorder) -> None:
        self.app = app
        self.recorder = recorder

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        started_at = datetime.now(UTC)
        session = session_of(environ, started_at)
        if session is None:
            return self.app(environ, start_response)
        mode = self.recorder.mode_for(session.cluster_id)
        if mode == "off":
            return self.app(environ, start_response)
        try:
            recording = self.recorder.begin(session, mode)
        except RecordingUnavailable:
            if mode == "required":
                metrics.RECORDINGS.labels("refused").inc()
                environ[env.SESSION] = session.ended(status="refused", failure="the recording could not be created")
                return ServiceUnavailable(
                    f"sessions on cluster {session.cluster_id} must be recorded and the recording cannot be "
                    "written; try again later or ask the gateway's operator", code_name="RECORDING_UNAVAILABLE",
                )(environ, start_response)
            metrics.RECORDINGS.labels("unrecorded").inc()
            environ[env.SESSION] = session.ended(status="failed", failure="the recording could not be created")
            return self.app(environ, start_response)
        answer: dict[str, Any] = {}

        def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answer["code"], answer["headers"] = int(status[:3]), headers
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        try:
            body = self.app(environ, _start_response)
        except BaseException:
            self._finish(environ, recording, None, "refused")
            raise
        if answer.get("code") != 101 or not hasattr(body, "tap"):
            self._finish(environ, recording, None, "refused")
            return body
        if session.transport == "websocket":
            subprotocol = _header(answer["headers"], "sec-websocket-protocol")
            if not websocket.records(subprotocol or "channel.k8s.io"):
                recording.fail("write", "the negotiated subprotocol is not one the recorder decodes")
        recording.start(session.transport, body.upstream_first)
        body.tap = recording
        return _RecordedBody(body, lambda result: self._finish(environ, recording, result, None))

    def _finish(self, environ: dict[str, Any], recording: Recording, result: Any, status: str | None) -> None:
        # The recording's own description (its id, stdin setting) with how the session ended.
        summary = recording.info.ended(ended_at=datetime.now(UTC), status=status or "recording")
        if result is not None:
            summary = summary.ended(bytes_to_upstream=result.to_upstream, bytes_to_client=result.to_client,
                                    extra={"ended_by": result.ended_by})
        environ[env.SESSION] = self.recorder.finish(recording, summary)




_OPTIONS: dict[str, conv.Converter] = {
    **recording_options.OPTIONS,
    "data_dir": conv.text,
    "database_url": conv.text,
    "secret_key": conv.text,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#session_recording``, right in front of the proxy
    (after ``cluster_routing``: it needs the user and the cluster)::

        [filter:session_recording]
        use = egg:bcs-middleware#session_recording
        get data_dir = data_dir
        record = on                        ; off | on | required
        record_clusters =
            prod-1 = required
        recording_store = directory        ; or database (with database_url or data_dir)
        recording_dir = recordings         ; relative: in data_dir
        recording_max_age = 720h
        recording_max_size = 10GiB

        [pipeline:main]
        pipeline = request_context token_auth cluster_routing session_recording upstream
    """
    from ..recording.directory import DirectoryStore

    opts = conv.convert_options("filter:session_recording", local_conf, _OPTIONS)
    try:
        settings = RecordingSettings.from_options(opts)
    except ValueError as exc:
        raise ConfigError(f"[filter:session_recording] {exc}") from None
    data_dir = Path(opts["data_dir"]) if opts.get("data_dir") else None
    store: RecordingStore
    if settings.store == "database":
        from ..store.database import open_database
        from ..store.recordings import RecordingRepository

        if not (opts.get("database_url") or data_dir):
            raise ConfigError("[filter:session_recording] recording_store = database needs database_url or data_dir")
        store = RecordingRepository(open_database(opts.get("database_url"), data_dir=data_dir,
                                                  secret_key=opts.get("secret_key")))
    else:
        directory = settings.directory or Path("recordings")
        if not directory.is_absolute():
            if data_dir is None:
                raise ConfigError("[filter:session_recording] needs data_dir or an absolute recording_dir")
            directory = data_dir / directory
        store = DirectoryStore(directory)
    recorder = SessionRecorder(store, settings)

    def make(app: Any) -> SessionRecordingMiddleware:
        return SessionRecordingMiddleware(app, recorder=recorder)

    return make
