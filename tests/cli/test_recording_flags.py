"""Every recording option of the gateway has a ``serve`` flag, and each flag reaches the embedded
gateway's configuration (not only an ini's ``[DEFAULT]``): ``--recording-buffer`` and
``--recording-stall-timeout`` were accepted and ignored without ``--config``."""

from __future__ import annotations

from pathlib import Path

from bcs_middleware.cli.loaders import gateway_options
from bcs_middleware.cli.parser import build_parser
from bcs_middleware.compose.gateway import config_from_options
from bcs_middleware.recording import settings

#: A value for each recording flag, and what the gateway's settings then hold.
GIVEN = {
    "--record": ("required", "mode", "required"),
    "--record-cluster": ("c1=off", "clusters", (("c1", "off"),)),
    "--recording-store": ("database", "store", "database"),
    "--recording-dir": ("/srv/casts", "directory", Path("/srv/casts")),
    "--recording-max-age": ("2h", "max_age", 7200.0),
    "--recording-max-size": ("3MiB", "max_bytes", 3 * 1024 * 1024),
    "--recording-max-size-per-user": ("1MiB", "max_bytes_per_user", 1024 * 1024),
    "--recording-retention-interval": ("7s", "retention_interval", 7.0),
    "--recording-heartbeat-timeout": ("9m", "heartbeat_timeout", 540.0),
    "--recording-buffer": ("2MiB", "buffer", 2 * 1024 * 1024),
    "--recording-stall-timeout": ("1.5s", "stall_timeout", 1.5),
}


def test_every_recording_flag_reaches_the_gateways_settings(tmp_path: Path) -> None:
    argv = ["serve", "--record-stdin"]
    for flag, (value, _attribute, _expected) in GIVEN.items():
        argv += [flag, value]
    args = build_parser("serve").parse_args(argv)
    config = config_from_options("serve", gateway_options(args, tmp_path, None, None))
    recording = config.recording
    assert recording.stdin is True
    for flag, (_value, attribute, expected) in GIVEN.items():
        assert getattr(recording, attribute) == expected, flag
    # Every ini key of the recording settings has a flag here (a new key without one fails).
    assert set(settings.ATTRIBUTES.values()) == {attribute for _v, attribute, _e in GIVEN.values()} | {"stdin"}
