"""The ``session_recording`` PasteDeploy filter: ini strings converted once, unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from paste.deploy import loadapp

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.layers.session_recording import SessionRecordingMiddleware, filter_factory
from bcs_middleware.recording.directory import DirectoryStore
from bcs_middleware.store.recordings import RecordingRepository


def _app(environ: dict, start_response):  # type: ignore[no-untyped-def]
    start_response("200 OK", [])
    return [b""]


def test_an_ini_pipeline_builds_the_layer(tmp_path: Path) -> None:
    ini = tmp_path / "app.ini"
    ini.write_text(f"""
[pipeline:main]
pipeline = session_recording app

[filter:session_recording]
use = egg:bcs-middleware#session_recording
data_dir = {tmp_path}
record = on
record_clusters =
    prod-1 = required
recording_max_age = 24h

[app:app]
paste.app_factory = tests.recording.test_filter:app_factory
""")
    layer = loadapp(f"config:{ini}")
    assert isinstance(layer, SessionRecordingMiddleware)
    settings = layer.recorder.settings
    assert (settings.mode, settings.clusters, settings.max_age) == ("on", (("prod-1", "required"),), 86400.0)
    assert settings.mode_for("prod-1") == "required" and settings.mode_for("other") == "on"
    store = layer.recorder.store
    assert isinstance(store, DirectoryStore) and store.directory == tmp_path / "recordings"


def test_the_database_store_from_an_ini(tmp_path: Path) -> None:
    make = filter_factory({}, data_dir=str(tmp_path), record="required", recording_store="database")
    assert isinstance(make(_app).recorder.store, RecordingRepository)


@pytest.mark.parametrize("options", [
    pytest.param({"record": "always"}, id="unknown mode"),
    pytest.param({"record_clusters": "a = sometimes"}, id="unknown cluster mode"),
    pytest.param({"recording_store": "s3"}, id="unknown store"),
    pytest.param({"recording_buffer": "1k"}, id="buffer below one read"),
    pytest.param({"recording_colour": "red"}, id="unknown key"),
])
def test_bad_settings_are_refused_naming_the_section(tmp_path: Path, options: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"filter:session_recording"):
        filter_factory({}, data_dir=str(tmp_path), **options)


def app_factory(global_conf: dict, **local_conf: str):  # type: ignore[no-untyped-def]
    return _app
