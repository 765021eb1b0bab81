"""The proxy's ``app_factory``: option conversions and refusals, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from bcs_middleware.apps.proxy import UpstreamProxy, app_factory
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.outbound.transport import PooledTransport


def test_factory_converts_every_option(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(trustme.CA().cert_pem.bytes().decode())
    app = app_factory(
        {},
        upstream="https://backend.test:8443/prefix/",
        ca_file=str(ca_file),
        verify="true",
        client_cert="/c.pem",
        client_key="/k.pem",
        tls_server_name="kubernetes",
        connect_timeout="500ms",
        read_timeout="2m",
        stream_idle_timeout="1h",
        trusted_proxies="10.0.0.0/8, 127.0.0.1",
        pool_maxsize="4",
    )
    assert isinstance(app, UpstreamProxy)
    transport = app.transport
    assert isinstance(transport, PooledTransport)
    assert (transport.connect_timeout, transport.read_timeout) == (0.5, 120.0)
    assert transport.stream_idle_timeout == 3600.0
    assert transport.pool_maxsize == 4
    upstream = app._fixed_upstream({"RAW_URI": "/api?x=1"})
    assert upstream.base_urls == ("https://backend.test:8443",)
    assert (upstream.path, upstream.query) == ("/prefix/api", "x=1")
    assert upstream.server_name == "kubernetes"
    assert upstream.client_cert == ("/c.pem", "/k.pem")
    assert upstream.ca_pem == ca_file.read_text()


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        pytest.param({"upstrem": "http://x"}, "unknown key 'upstrem'", id="unknown-key"),
        pytest.param({"upstream": "ftp://x"}, "bad value for 'upstream'", id="not-http"),
        pytest.param({"read_timeout": "soon"}, "bad value for 'read_timeout'", id="bad-duration"),
        pytest.param({"pool_maxsize": "0"}, "bad value for 'pool_maxsize'", id="zero-pool"),
        pytest.param({"client_cert": "/c.pem"}, "go together", id="cert-without-key"),
        pytest.param({"ca_file": "/nonexistent/ca.pem"}, "cannot read ca_file", id="missing-ca"),
        pytest.param({"trusted_proxies": "not-an-ip"}, "trusted_proxies", id="bad-proxy"),
    ],
)
def test_factory_rejects_bad_configuration(conf: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        app_factory({}, **conf)
