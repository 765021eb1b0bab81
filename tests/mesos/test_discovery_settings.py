"""The Mesos drivers' discovery from configuration: one reading of the discovery keys for the
gateway's configuration and the ``mesos_routing`` paste filter (discovery/settings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.compose.ini import gateway_config
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.discovery.settings import DiscoverySettings, drivers_discovery
from bcs_middleware.discovery.zookeeper import ZookeeperDiscovery
from bcs_middleware.layers.mesos_route import filter_factory

DRIVERS = "c1 = http://127.0.0.1:1 https://127.0.0.1:2\nc2 = https://[::1]:3"


def _next(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    raise AssertionError("not called")


def test_the_filter_and_the_gateway_find_the_same_drivers_from_the_same_keys(tmp_path: Path) -> None:
    layer = filter_factory({}, static_drivers=DRIVERS)(_next)
    gateway = drivers_discovery(gateway_config("app:main", {"data_dir": str(tmp_path),
                                                            "static_drivers": DRIVERS}).discovery)
    for cluster in ("c1", "c2", "c3"):
        assert layer.discovery.drivers(cluster) == gateway.drivers(cluster)
        assert layer.discovery.registered(cluster) == gateway.registered(cluster) == (cluster != "c3")
    assert [e.base_url() for e in layer.discovery.drivers("c1")] == ["http://127.0.0.1:1", "https://127.0.0.1:2"]
    assert {e.cluster for e in layer.discovery.drivers("c1")} == {"c1"}


def test_the_filters_zookeeper_keys_reach_the_zookeeper_discovery() -> None:
    layer = filter_factory({}, zookeeper_hosts="127.0.0.1:1", zookeeper_root="/elsewhere",
                           zookeeper_timeout="3s")(_next)
    assert isinstance(layer.discovery, ZookeeperDiscovery)
    assert (layer.discovery.hosts, layer.discovery.root, layer.discovery.timeout) == ("127.0.0.1:1", "/elsewhere", 3.0)
    # The gateway has no zookeeper_timeout key: the settings' default, ZookeeperDiscovery's own.
    gateway = drivers_discovery(DiscoverySettings(zookeeper_hosts="127.0.0.1:1"))
    assert isinstance(gateway, ZookeeperDiscovery) and gateway.timeout == 10.0


@pytest.mark.parametrize(("options", "message"), [
    pytest.param({"static_drivers": "c1 = ftp://127.0.0.1:1"},
                 r"^\[filter:mesos_routing\] bad value for 'static_drivers': not an http\(s\) URL", id="bad-url"),
    pytest.param({"static_drivers": "c1 http://127.0.0.1:1"},
                 r"^\[filter:mesos_routing\] bad value for 'static_drivers': expected 'key = value'", id="no-equals"),
    pytest.param({"zookeeper_hosts": "127.0.0.1:1", "static_drivers": "c1 = http://127.0.0.1:1"},
                 r"^\[filter:mesos_routing\] set zookeeper_hosts or static_drivers, not both", id="both"),
    pytest.param({"zookeeper_timeout": "soon"}, r"^\[filter:mesos_routing\] bad value for 'zookeeper_timeout'",
                 id="bad-timeout"),
])
def test_the_filter_refuses_bad_discovery_options_naming_section_and_key(options: dict[str, str],
                                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        filter_factory({}, **options)


def test_the_gateway_refuses_a_bad_driver_url_as_configuration(tmp_path: Path) -> None:
    config = gateway_config("app:main", {"data_dir": str(tmp_path), "static_drivers": "c1 = ftp://127.0.0.1:1"})
    with pytest.raises(ConfigError, match=r"^bad value for 'static_drivers': not an http\(s\) URL"):
        drivers_discovery(config.discovery)
