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
recorded the same way: WebSocket — every subprotocol the apiserver accepts, binary
(``v5``/``v4.channel.k8s.io``, kubectl's) and base64 (``v4.base64.channel.k8s.io``, browser
terminals'), decoded by the one the apiserver's ``101`` named — and SPDY/3.1, to an apiserver
reached directly or through an agent tunnel.

A session that is not recorded (policy ``off``, or ``on`` when the recording could not be
created) is still described for its audit event: the layer reads the exit status off the
error channel as the stream passes (:mod:`bcs_middleware.recording.exit_status`) and keeps
nothing else of it — stdin is never stored. The gateway puts the layer in front of the proxy
whenever a cluster records or sessions are audited.

Reads ``bcs.facts`` (the upgrade, the exec/attach classification), ``bcs.user``,
``bcs.cluster``, ``bcs.upstream`` (the connect options sent). Sets ``bcs.session`` (the
session as it ended, with its recording id — none when unrecorded — and exit status) when the
stream closes, for the audit layer.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.errors import ConfigError, ServiceUnavailable
from ..core.worker_start import at_worker_start
from ..recording import settings as recording_options
from ..recording import websocket
from ..recording.catalog import RecordingStore, RecordingUnavailable, SessionInfo, describe
from ..recording.exit_status import ExitStatusTap
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
    name, groups = env.kubernetes_identity(env.get_user(environ))
    cluster = env.get_cluster(environ)
    upstream = env.get_upstream(environ)
    return describe(
        info, cluster_id=cluster.id if cluster is not None else facts.cluster_id or "",
        user=name, groups=groups,
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


class _Answer:
    """The status and headers the app below started its response with."""

    def __init__(self, start_response: Any) -> None:
        self._start_response = start_response
        self.code = 0
        self.headers: list[tuple[str, str]] = []

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        self.code, self.headers = int(status[:3]), headers
        return self._start_response(status, headers, exc_info) if exc_info else self._start_response(status, headers)

    @property
    def subprotocol(self) -> str:
        """The WebSocket subprotocol the apiserver's ``101`` named — the one the client and the
        apiserver speak from now on, so the one the stream is decoded by ("": none)."""
        return _header(self.headers, "sec-websocket-protocol").strip()

    def spliced(self, body: Any, transport: str) -> bool:
        """The apiserver answered ``101`` with a stream whose framing the decoders read."""
        if self.code != 101 or not hasattr(body, "tap"):
            return False
        return transport != "websocket" or websocket.records(self.subprotocol)


def _start_if_alive(ref: weakref.ref[SessionRecorder]) -> Callable[[], None]:
    # Weakly: an application built and dropped (a test, a check) leaves nothing to start behind.
    def start() -> None:
        recorder = ref()
        if recorder is not None:
            recorder.start()

    return start


class SessionRecordingMiddleware:
    """Record exec/attach sessions per the recording policy of their cluster.

    A session that is not recorded (policy ``off``, or ``on`` with a recording that could not
    be created) still gets its record in ``bcs.session`` when ``observe_unrecorded``: the exit
    status is read from the error channel as it passes (:class:`~bcs_middleware.recording.
    exit_status.ExitStatusTap`), nothing else of the stream is kept.

    :param app: the proxy (the terminal app that answers upgrades with
        :class:`~bcs_middleware.apps.upgrade.UpgradedStream`).
    :param recorder: the policy, the store and the writer.
    :param observe_unrecorded: read unrecorded sessions' exit status for the audit event.

    Example (the gateway composition builds it from ``record*`` settings)::

        SessionRecordingMiddleware(proxy, recorder=SessionRecorder(DirectoryStore(path), settings))
    """

    def __init__(self, app: Any, *, recorder: SessionRecorder, observe_unrecorded: bool = True) -> None:
        self.app = app
        self.recorder = recorder
        self.observe_unrecorded = observe_unrecorded
        # The writer (and with it retention and the end of sessions a dead worker left
        # "recording") runs from the worker's start, not from its first recorded session, and
        # also where nothing is recorded now: recordings made before are still kept by the rules.
        at_worker_start(_start_if_alive(weakref.ref(recorder)))

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        started_at = datetime.now(UTC)
        session = session_of(environ, started_at)
        if session is None:
            return self.app(environ, start_response)
        mode = self.recorder.mode_for(session.cluster_id)
        if mode == "off":
            return self._unrecorded(environ, start_response, session.ended(status="off"))
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
            return self._unrecorded(environ, start_response,
                                    session.ended(status="failed", failure="the recording could not be created"))
        answer = _Answer(start_response)
        try:
            body = self.app(environ, answer)
        except BaseException:
            self._finish(environ, recording, None, "refused")
            raise
        if answer.code != 101 or not hasattr(body, "tap"):
            self._finish(environ, recording, None, "refused")
            return body
        if not answer.spliced(body, session.transport):
            recording.fail("write", "the negotiated subprotocol is not one the recorder decodes")
        recording.start(session.transport, body.upstream_first, subprotocol=answer.subprotocol)
        body.tap = recording
        return _RecordedBody(body, lambda result: self._finish(environ, recording, result, None))

    def _unrecorded(self, environ: dict[str, Any], start_response: Any, session: SessionInfo) -> Iterable[bytes]:
        """A session not recorded: its record (exit status from the error channel) for the audit event."""
        if session.status != "off":
            environ[env.SESSION] = session  # what became of the recording, whatever the answer
        if not self.observe_unrecorded:
            return self.app(environ, start_response)
        answer = _Answer(start_response)
        body = self.app(environ, answer)
        if not answer.spliced(body, session.transport):
            return body
        tap = ExitStatusTap(session.transport, answer.subprotocol)
        if body.upstream_first:
            tap.observe(False, body.upstream_first)
        body.tap = tap

        def ended(result: Any) -> None:
            summary = session.ended(ended_at=datetime.now(UTC), exit_code=tap.exit_code)
            if result is not None:
                summary = summary.ended(bytes_to_upstream=result.to_upstream, bytes_to_client=result.to_client,
                                        extra={"ended_by": result.ended_by})
            environ[env.SESSION] = summary

        return _RecordedBody(body, ended)

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
        recording_max_size_per_user = 1GiB ; one user's share, applied first

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
