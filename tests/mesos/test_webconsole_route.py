"""The driver's webconsole route in-process: where each host_ip goes, and its factory options."""

from __future__ import annotations

from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.compose.driver import app_factory, build_driver
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.discovery.static import StaticDiscovery


def _capture(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    upstream = env.get_upstream(environ)
    assert upstream is not None
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{upstream.base_urls[0]}{upstream.path}?{upstream.query}".encode()]


def _client(**options: Any) -> Client:
    return Client(build_driver(cluster_id="c1", discovery=StaticDiscovery(schedulers=["http://127.0.0.1:9"]),
                               proxy=_capture, webconsole_options=options))


@pytest.mark.parametrize(
    ("query", "status", "target"),
    [
        pytest.param("host_ip=10.0.0.7&c=1", 200, "https://10.0.0.7:8083/bcsapi/v1/consoleproxy/exec?host_ip=10.0.0.7&c=1",
                     id="ipv4"),
        pytest.param("host_ip=fd00::7", 200, "https://[fd00::7]:8083/bcsapi/v1/consoleproxy/exec?host_ip=fd00::7",
                     id="ipv6-in-brackets"),
        pytest.param("host_ip=fe80::1%25eth0", 400, None, id="zone"),
        pytest.param("host_ip=10.0.0.7%2F24", 400, None, id="network"),
        pytest.param("host_ip=evil.example", 400, None, id="name"),
        pytest.param("host_ip=10.0.0.7@evil.example", 400, None, id="userinfo"),
        pytest.param("c=1", 400, None, id="missing"),
    ],
)
def test_host_ip_must_be_one_ip_address(query: str, status: int, target: str | None) -> None:
    response = _client().get(f"/mesosdriver/v4/webconsole/exec?{query}", headers={"BCS-ClusterID": "c1"})
    assert response.status_code == status, response.text
    if target is not None:
        assert response.text == target


def test_console_port_scheme_and_factory_options(tmp_path: Any) -> None:
    response = _client(port=9443, scheme="http").get("/mesosdriver/v4/webconsole/a/b?host_ip=10.0.0.7",
                                                      headers={"BCS-ClusterID": "c1"})
    assert response.text.startswith("http://10.0.0.7:9443/bcsapi/v1/consoleproxy/a/b?")
    assert _client().get("/mesosdriver/v4/webconsole/a?host_ip=10.0.0.7").status_code == 400  # no BCS-ClusterID
    driver = app_factory({}, cluster_id="c1", static_schedulers="http://127.0.0.1:9", console_port="9443",
                         upstream_deny="10.0.0.0/8")
    assert driver.webconsole.port == 9443
    with pytest.raises(ConfigError, match="console_cert_file and console_key_file"):
        app_factory({}, cluster_id="c1", static_schedulers="http://127.0.0.1:9", console_cert_file="/x.crt")
    with pytest.raises(ConfigError, match="console_ca_file"):
        app_factory({}, cluster_id="c1", static_schedulers="http://127.0.0.1:9",
                    console_ca_file=str(tmp_path / "missing.pem"))
