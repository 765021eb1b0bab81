"""A throwaway PostgreSQL server for the suite.

PostgreSQL refuses to run as root, so when the suite runs as root the server is
started as the ``postgres`` user (``runuser``) in a temp directory it owns,
listening on 127.0.0.1 only, on a free port, with ``trust`` auth for loopback.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from .servers import free_port


def pg_bindir() -> Path | None:
    configured = os.environ.get("BCS_TEST_PG_BINDIR")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin)")
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="bcs-pg-"))
        self.datadir = self.root / "data"
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o700)
        self._run([str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
                   "--no-sync", "-E", "UTF8"])
        self._run([
            str(bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.root / "log"), "-w", "-t", "60",
            "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            "start",
        ])

    def _run(self, argv: list[str]) -> None:
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=self.root)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, template: str | None = None) -> str:
        """A new database (a copy of ``template``, a database nobody is connected to); its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        import psycopg

        copy_of = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy_of}')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop"])
        except (subprocess.SubprocessError, OSError):
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                shutil.rmtree(self.root)
                break
            except OSError:
                time.sleep(0.2)
