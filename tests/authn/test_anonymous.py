"""``anonymous`` of the AuthenticationConfiguration: read as kube-apiserver reads it, decided in one place.

The refusals are kube-apiserver's own test vectors
(``pkg/kubeapiserver/options/authentication_test.go``, ``TestToAuthenticationConfig_Anonymous``).
"""

from __future__ import annotations

from typing import Any

import pytest

from bcs_middleware.authn.anonymous import AnonymousAuth
from bcs_middleware.authn.config import parse_configuration
from bcs_middleware.core.errors import ConfigError


def _parse(anonymous: Any) -> AnonymousAuth | None:
    return parse_configuration({"apiVersion": "apiserver.config.k8s.io/v1alpha1",
                                "kind": "AuthenticationConfiguration", "anonymous": anonymous}).anonymous


def test_absent_disabled_enabled_and_conditions_are_read() -> None:
    assert parse_configuration({"apiVersion": "apiserver.config.k8s.io/v1",
                                "kind": "AuthenticationConfiguration"}).anonymous is None
    assert _parse({"enabled": False}) == AnonymousAuth(False)
    assert _parse({"enabled": True}) == AnonymousAuth(True)
    assert _parse({"enabled": True, "conditions": [{"path": "/livez"}, {"path": "/readyz"}]}) \
        == AnonymousAuth(True, frozenset({"/livez", "/readyz"}))


@pytest.mark.parametrize("anonymous, message", [
    pytest.param({"enabled": False, "conditions": [{"path": "/livez"}]},
                 "anonymous.conditions: Invalid value: enabled should be set to true when conditions are defined",
                 id="disabled-with-conditions"),
    pytest.param({"conditions": [{"path": "/livez"}]}, "enabled should be set to true when conditions are defined",
                 id="missing-with-conditions"),
    pytest.param({"enabled": "yes"}, "anonymous.enabled: must be a boolean", id="not-a-boolean"),
    pytest.param({"enabled": True, "paths": ["/livez"]}, "anonymous.paths: unknown field", id="strict"),
    pytest.param({"enabled": True, "conditions": [{"path": "/x", "method": "GET"}]},
                 r"anonymous.conditions\[0\].method: unknown field", id="strict-condition"),
    pytest.param({"enabled": True, "conditions": [{"path": "livez"}]}, "must be an absolute path", id="relative"),
    pytest.param({"enabled": True, "conditions": [{}]}, "must be an absolute path", id="no-path"),
])
def test_invalid_anonymous_is_refused_at_load(anonymous: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(anonymous)


def test_only_the_condition_paths_exactly() -> None:
    anonymous = AnonymousAuth(True, frozenset({"/tunnels/clusters/C/version"}))
    assert anonymous.admits("/tunnels/clusters/C/version", "GET", "kubernetes")
    for path in ("/tunnels/clusters/C/version/", "/tunnels/clusters/C/versions", "/tunnels/clusters/C//version",
                 "/tunnels/clusters/C/api"):
        assert not anonymous.admits(path, "GET", "kubernetes"), path


def test_the_kubernetes_route_for_every_method_the_management_api_for_reads_nothing_else() -> None:
    anywhere = AnonymousAuth(True)
    for method in ("GET", "POST", "DELETE", "PATCH"):
        assert anywhere.admits("/tunnels/clusters/C/api/v1/pods", method, "kubernetes")  # the cluster's RBAC decides
    assert anywhere.admits("/rest/whoami", "GET", "management")
    assert anywhere.admits("/rest/clusters", "HEAD", "management")
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"):
        assert not anywhere.admits("/rest/clusters/bcs", method, "management"), method
    for kind in ("mesos", "webconsole", "agent_connect", "driver", "bcsapi", "rbac_status", "metrics"):
        assert not anywhere.admits("/x", "GET", kind), kind  # type: ignore[arg-type]
    # No route of the gateway's: the application behind the filter decides what anonymous may do.
    assert anywhere.admits("/hello", "POST", None)
    assert not AnonymousAuth(False).admits("/rest/whoami", "GET", "management")
