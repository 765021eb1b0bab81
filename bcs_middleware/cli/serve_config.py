"""What ``bcs-middleware serve --config FILE.ini`` takes from the ini and what from the command line.

The rule, for every option (so none is silently ignored):

* **the server** (bind, workers, worker class, threads, connections, keep-alive,
  graceful timeout, TLS files): a command-line flag wins over the ini's
  ``[server:main]``, which wins over ``serve``'s default. A ``[server:main]`` key
  ``serve`` does not know is refused, naming it.
* **the application** is the ini's. A flag that configures it (``--cluster-id``,
  ``--scheduler``, ``--database-url``, ``--audit-log``, ``--peer-address``…) fills the
  ini's ``[DEFAULT]`` value of that name, as ``--data-dir`` fills ``data_dir``; when
  the ini's application does not take the value from ``[DEFAULT]`` (the key is
  missing there, or its section sets its own), the flag is refused with the key to
  set instead — it could not do what it says.
* ``--role`` must name the ini's application (``gateway`` or ``driver``), when given.

Everything here reads files and judges strings; nothing is started.
"""

from __future__ import annotations

import configparser
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..audit.export.settings import OPTIONS as _AUDIT_EXPORT_OPTIONS
from ..core.errors import ConfigError

# serve's audit export flags fill the ini's [DEFAULT] keys of the same names.
AUDIT_EXPORT_KEYS = tuple(key for key in _AUDIT_EXPORT_OPTIONS if key != "audit_spool_dir")

#: ``[server:main]`` keys ``serve`` takes (PasteDeploy's ``use`` and gunicorn's
#: ``host``/``port`` included), with their converters.
SERVER_KEYS: dict[str, Callable[[str], Any]] = {
    "use": str,
    "bind": str,
    "host": str,
    "port": int,
    "workers": int,
    "worker_class": str,
    "threads": int,
    "worker_connections": int,
    "keepalive": int,
    "graceful_timeout": int,
    "certfile": str,
    "keyfile": str,
    "ca_file": str,
}
WORKER_CLASSES = ("gevent", "gthread")


@dataclass(frozen=True)
class AppFlag:
    """An application option ``serve`` also has a flag for.

    :param dest: the flag's ``argparse`` destination.
    :param keys: the ``[DEFAULT]`` names it fills (the first one present is used).
    :param app_key: the application's option that must then hold the value.
    """

    dest: str
    keys: tuple[str, ...]
    app_key: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


APP_FLAGS = (
    AppFlag("database_url", ("database_url",), "database_url"),
    AppFlag("cluster_id", ("cluster_id",), "cluster_id"),
    AppFlag("scheduler", ("scheduler", "static_schedulers"), "static_schedulers"),
    AppFlag("scheduler_ca_file", ("scheduler_ca_file",), "scheduler_ca_file"),
    AppFlag("console_port", ("console_port",), "console_port"),
    AppFlag("console_ca_file", ("console_ca_file",), "console_ca_file"),
    AppFlag("console_http", ("console_scheme",), "console_scheme"),
    AppFlag("public_url", ("public_url",), "public_url"),
    AppFlag("peer_address", ("peer_address",), "peer_address"),
    AppFlag("audit_log", ("audit_log",), "audit_log"),
    AppFlag("audit_policy", ("audit_policy_file",), "audit_policy_file"),
    AppFlag("static_driver", ("static_drivers",), "static_drivers"),
    AppFlag("driver_ca_file", ("driver_ca_file",), "driver_ca_file"),
    AppFlag("client_cert_map", ("client_cert_subjects",), "client_cert_subjects"),
    AppFlag("authentication_config", ("authentication_config",), "authentication_config"),
    AppFlag("superuser_group", ("superuser_groups",), "superuser_groups"),
    AppFlag("upstream_allow", ("upstream_allow",), "upstream_allow"),
    AppFlag("upstream_deny", ("upstream_deny",), "upstream_deny"),
    AppFlag("no_access_log", ("access_log",), "access_log"),
    AppFlag("record", ("record",), "record"),
    AppFlag("record_cluster", ("record_clusters",), "record_clusters"),
    AppFlag("record_stdin", ("record_stdin",), "record_stdin"),
    AppFlag("recording_store", ("recording_store",), "recording_store"),
    AppFlag("recording_dir", ("recording_dir",), "recording_dir"),
    AppFlag("recording_max_age", ("recording_max_age",), "recording_max_age"),
    AppFlag("recording_max_size", ("recording_max_size",), "recording_max_size"),
    *(AppFlag(dest, (dest,), dest) for dest in ("recording_max_size_per_user", "recording_retention_interval",
                                                "recording_heartbeat_timeout", "recording_buffer",
                                                "recording_stall_timeout")),
    AppFlag("limits_config", ("limits_config",), "limits_config"),
    *(AppFlag(dest, (dest,), dest) for dest in AUDIT_EXPORT_KEYS),
)


def read_ini(path: Path) -> configparser.ConfigParser:
    """The ini's sections as written — ``[DEFAULT]`` is one of them, not merged into the others
    (:func:`defaults`); a missing file or a syntax error is a :class:`ConfigError`."""
    parser = configparser.ConfigParser(interpolation=None, default_section="\0 no default section")
    try:
        with open(path, encoding="utf-8") as fh:
            parser.read_file(fh)
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: {' '.join(str(exc).split())}") from None
    return parser


def defaults(parser: configparser.ConfigParser) -> dict[str, str]:
    """The ini's ``[DEFAULT]`` values."""
    return dict(parser["DEFAULT"]) if parser.has_section("DEFAULT") else {}


def server_section(parser: configparser.ConfigParser, path: Path) -> dict[str, Any]:
    """``[server:main]`` converted, every key checked (none: ``{}``)."""
    if not parser.has_section("server:main"):
        return {}
    values: dict[str, Any] = {}
    for key, raw in parser["server:main"].items():
        convert = SERVER_KEYS.get(key)
        if convert is None:
            raise ConfigError(f"{path} [server:main] {key}: serve does not take this setting (it takes "
                              f"{', '.join(sorted(SERVER_KEYS))}; for any other gunicorn setting run "
                              "gunicorn --paste with a gunicorn config file)")
        try:
            values[key] = convert(raw.strip())
        except ValueError:
            raise ConfigError(f"{path} [server:main] {key} = {raw!r}: not a number") from None
        if convert is int and values[key] < (0 if key == "keepalive" else 1):
            raise ConfigError(f"{path} [server:main] {key} = {raw}: must be positive")
    if "worker_class" in values and values["worker_class"] not in WORKER_CLASSES:
        raise ConfigError(f"{path} [server:main] worker_class = {values['worker_class']}: serve runs "
                          f"{' or '.join(WORKER_CLASSES)}")
    if "bind" not in values and "host" in values:
        values["bind"] = f"{values['host']}:{values.get('port', 8443)}"
    return values


def option_value(argv: Sequence[str], option: str) -> str | None:
    """The last value of ``option`` (``--opt VALUE`` or ``--opt=VALUE``) on a command line, read
    before ``argparse`` runs."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.partition("=")[2]
    return value


def ini_worker_class(argv: Sequence[str]) -> str | None:
    """The ``[server:main] worker_class`` of a ``serve --config FILE`` command line, if it has one
    (read before anything is imported: it decides whether to patch for gevent). Unreadable: ``None``
    — ``serve`` reports the error itself later."""
    config = option_value(argv, "--config")
    if config is None:
        return None
    try:
        parser = read_ini(Path(config))
        return str(server_section(parser, Path(config)).get("worker_class") or "") or None
    except ConfigError:
        return None


def flag_value(dest: str, value: Any) -> str:
    """A flag's value written as the ini's option would be."""
    if dest == "console_http":
        return "http"
    if dest == "no_access_log":
        return "false"
    if dest == "static_driver":
        drivers: dict[str, list[str]] = {}
        for spec in value:
            cluster, _, url = spec.partition("=")
            drivers.setdefault(cluster.strip(), []).append(url.strip())
        return "".join(f"\n{cluster} = {' '.join(urls)}" for cluster, urls in drivers.items())
    if dest == "record_cluster":
        return "".join(f"\n{spec.partition('=')[0].strip()} = {spec.partition('=')[2].strip()}" for spec in value)
    if dest == "record_stdin":
        return "true"
    if dest == "client_cert_map":
        return "\n" + "\n".join(value)
    if isinstance(value, list):
        return " ".join(value)
    return str(value)


def given_app_flags(args: Any) -> dict[AppFlag, str]:
    """The application flags given on the command line, as ini values."""
    given = {}
    for flag in APP_FLAGS:
        value = getattr(args, flag.dest, None)
        if value not in (None, False, [], ""):
            given[flag] = flag_value(flag.dest, value)
    return given


def fill_defaults(parser: configparser.ConfigParser, given: Mapping[AppFlag, str]) -> dict[str, str]:
    """The ``global_conf`` entries that put the flags' values into the ini's ``[DEFAULT]``."""
    present = defaults(parser)
    filled = {}
    for flag, value in given.items():
        key = next((k for k in flag.keys if k in present), None)
        if key is not None:
            filled[key] = value
    return filled


def refuse_unused_flags(given: Mapping[AppFlag, str], app_conf: Mapping[str, str], path: Path) -> None:
    """Refuse each flag the application does not end up with (its option differs or is absent)."""
    for flag, value in given.items():
        if app_conf.get(flag.app_key, "").strip() != value.strip():
            raise ConfigError(
                f"{flag.flag} with --config {path}: the ini's application does not take {flag.app_key} from "
                f"[DEFAULT], so the flag would change nothing. Set {flag.app_key} in the ini, or give its "
                f"[DEFAULT] a {flag.keys[0]} and its application section 'get {flag.app_key} = {flag.keys[0]}'"
            )


def app_context(config_uri: str, global_conf: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The ini's application: its role (``gateway``, ``driver`` or ``other``) and its options as
    its factory will get them (through pipelines to the application at their end)."""
    from paste.deploy.loadwsgi import APP, loadcontext

    from ..compose import driver, gateway

    try:
        context = loadcontext(APP, config_uri, global_conf=dict(global_conf))
    except (LookupError, OSError, ImportError, configparser.Error) as exc:
        raise ConfigError(f"{config_uri.removeprefix('config:')}: {exc}") from None
    while getattr(context, "app_context", None) is not None:
        context = context.app_context
    factory = context.object
    role = "gateway" if factory is gateway.app_factory else "driver" if factory is driver.app_factory else "other"
    return role, dict(context.local_conf)
