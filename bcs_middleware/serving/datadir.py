"""The one data directory every way of running the gateway shares, and what in it is whose.

``bcs-middleware serve``, ``serve --config examples/gateway.ini`` and ``gunicorn
--paste examples/gateway.ini -c examples/gunicorn.conf.py`` all keep their state in
one directory (``./bcs-data`` unless told otherwise). Several servers may run in one
data directory (a gateway and a driver, two gateways on different ports); what they
share and what each keeps for itself:

* shared — ``bcs.sqlite3`` the store (SQLite in WAL mode takes several writers),
  ``secret.key`` its Fernet key (0600), ``admin.token`` the bootstrap admin's token
  (0600; unless ``BCS_ADMIN_TOKEN`` is set), ``tls/`` the generated CA and the HTTPS
  certificate it signed (renewed under a file lock; it names every host any of the
  servers asked for);
* shared, as locks — ``bcs.sqlite3.migrate.lock`` (one migration at a time) and
  ``tls/.lock`` (one certificate check or renewal at a time);
* shared, appended — an audit log given as a relative path of the audit filter
  (``audited_gateway.ini``: ``audit.jsonl``): each server appends whole lines;
* per worker — ``audit-spool/<backend>/<n>/`` the audit events a worker has not exported yet
  (:mod:`bcs_middleware.audit.export.spool`): each worker holds one slot by a file lock; a
  restarted worker, or any worker of any server here, takes over a slot no process holds;
* per server — ``prometheus/<pid>/`` the metrics of one server's workers
  (:func:`server_metrics_dir`; ``<pid>`` is the server's master), removed by the next
  server that starts once its server is gone.

Nothing else is written there by a server: gunicorn's control socket is off (``serve``
and ``examples/gunicorn.conf.py`` disable it; it would be one fixed path under
``~/.gunicorn`` for every server), logs go to stdout/stderr, no pid file is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import sys
from pathlib import Path

from ..core.forksafe import process_alive

DEFAULT_DATA_DIR = "bcs-data"
ADMIN_TOKEN_FILE = "admin.token"
ADMIN_TOKEN_ENV = "BCS_ADMIN_TOKEN"
# The bootstrap_users source every entry point uses (bootstrap.parse_bootstrap_users): the
# environment's token, else the data directory's file — generated there when the database
# holds no token for the user yet.
ADMIN_TOKEN_SOURCE = f"env:{ADMIN_TOKEN_ENV} file:{ADMIN_TOKEN_FILE}"
METRICS_DIR = "prometheus"
_OWNER_LOCK = ".owner"
_SERVER_DIR = re.compile(r"\d+|\.\d+\.new")
# This process's lock on its metrics directory: held (by the master and, inherited, by its
# workers) for as long as the server runs.
_held: list[int] = []


def write_secret_file(path: Path, value: str) -> None:
    """Create ``path`` (mode 0600, never over an existing file) holding ``value``.

    :raises FileExistsError: when it exists.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")


def tighten(path: Path) -> None:
    """A secret file left readable to others (by hand, or by a restored backup) becomes 0600."""
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except FileNotFoundError:
        pass


def announce_generated_admin_token(path: Path, value: str) -> None:
    """Tell the operator about a token generated now: its value only to a terminal, once."""
    # The value goes to a person at a terminal, never to stdout (the access log's stream,
    # usually collected): piped or under a supervisor, only the file is named.
    if sys.stderr.isatty():
        print(
            "\n  Generated the bootstrap admin token (shown only this once; also in "
            f"{path}, mode 0600):\n\n    {value}\n",
            file=sys.stderr, flush=True,
        )
    else:
        print(f"Generated the bootstrap admin token in {path} (mode 0600)", flush=True)


def announce_admin_token_file(data_dir: Path) -> None:
    """Name the admin token's file, when that is where this server's token comes from."""
    path = data_dir / ADMIN_TOKEN_FILE
    if not os.environ.get(ADMIN_TOKEN_ENV, "").strip() and path.exists():
        tighten(path)
        print(f"Admin token: {path}", flush=True)


def prepare(data_dir: str | Path) -> Path:
    """Create the data directory (0700) and return its absolute path."""
    path = Path(data_dir).absolute()
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _gone(directory: Path) -> bool:
    """Whether the server that made ``directory`` has ended (nobody holds its lock)."""
    try:
        fd = os.open(directory / _OWNER_LOCK, os.O_RDWR)
    except FileNotFoundError:
        if directory.name.startswith("."):  # being made: locked right after it was created
            return not process_alive(int(directory.name[1:].partition(".")[0]))
        return True  # a named directory is renamed only once locked
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases the lock if we took it
    return True




def server_metrics_dir(data_dir: Path) -> Path:
    """This server's own ``PROMETHEUS_MULTIPROC_DIR``: ``DATA_DIR/prometheus/<pid>``.

    Call it in the server's master, before workers fork. prometheus_client's multiprocess
    mode sums every file in its directory, so servers sharing one would each show the
    other's traffic, and a server clearing it at start would wipe a running server's
    series. Each server gets a directory of its own, locked (``flock``) for as long as
    the server or any of its workers lives; a start removes the directories whose lock is
    free — their server is gone, even killed — and never a running server's.
    """
    root = data_dir / METRICS_DIR
    root.mkdir(mode=0o700, exist_ok=True)
    for entry in root.iterdir():
        if _SERVER_DIR.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            if _gone(entry):
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.suffix == ".db":
            entry.unlink(missing_ok=True)  # the flat layout of older versions
    mine = root / str(os.getpid())
    # Made under another name with its lock held, then renamed: another server starting
    # meanwhile never sees it unlocked.
    building = root / f".{os.getpid()}.new"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(mode=0o700)
    fd = os.open(building / _OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(mine)  # a dead server's whose pid this process has now
    building.rename(mine)
    _held.append(fd)
    return mine
