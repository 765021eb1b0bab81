"""Fixtures: fake upstreams (plain and TLS) and the proxy under a real gunicorn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerProcess, gunicorn

ROOT = Path(__file__).resolve().parents[2]
# The proxy's own connection to 127.0.0.2 is trusted in the ini proxy;
# clients on 127.0.0.1 are not.
TRUSTED_CLIENT = "127.0.0.2"


@pytest.fixture(scope="package")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="package")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture(scope="package")
def fake_tls(ca: trustme.CA) -> Iterator[FakeUpstream]:
    ctx = _server_context(ca, "127.0.0.1", "localhost")
    with FakeUpstream(tls=ctx) as server:
        yield server


@pytest.fixture(scope="package")
def fake_kubernetes(ca: trustme.CA) -> Iterator[FakeUpstream]:
    """TLS upstream whose certificate names only ``kubernetes`` (as apiservers' often do)."""
    with FakeUpstream(tls=_server_context(ca, "kubernetes")) as server:
        yield server


def _server_context(ca: trustme.CA, *names: str):  # type: ignore[no-untyped-def]
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(ctx)
    return ctx


def _env() -> dict[str, str]:
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="package")
def proxy(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``upstream_proxy`` from an ini file, fixed upstream = the plain fake."""
    ini = tmp_path_factory.mktemp("proxy") / "proxy.ini"
    ini.write_text(
        "[app:main]\n"
        "use = egg:bcs-middleware#upstream_proxy\n"
        f"upstream = {fake.url}\n"
        "connect_timeout = 2s\n"
        "read_timeout = 30s\n"
        "stream_idle_timeout = 30s\n"
        f"trusted_proxies = {TRUSTED_CLIENT}/32\n"
    )
    # gunicorn itself believes X-Forwarded-Proto from 127.0.0.1 by default
    # (wsgi.url_scheme); switch that off so only the proxy's own rule applies.
    server = gunicorn(str(ini), env=_env(), threads=8, extra=["--forwarded-allow-ips", ""])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def routed() -> Iterator[ServerProcess]:
    """The proxy behind a stand-in routing layer (``tests.apps.routed_app``)."""
    server = gunicorn("tests.apps.routed_app:app", env=_env(), threads=8)
    try:
        yield server
    finally:
        server.stop()
