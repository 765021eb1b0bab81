"""Distributed claims references, read as kube-apiserver's ``claimResolver.expand`` reads them.

Cases from ``staging/src/k8s.io/apiserver/plugin/pkg/authenticator/token/oidc/oidc_test.go``
(the "groups distributed" family): the claim present, no ``_claim_names``, a name without a
source, no ``_claim_sources``, an aggregated claim; the gateway's own rule on top (https only).
"""

from __future__ import annotations

from typing import Any

import pytest

from bcs_middleware.authn.claim_sources import ClaimSource, distributed_source
from bcs_middleware.authn.verify import TokenRejected

URL = "https://idp.example.com/groups"
NAMES = {"_claim_names": {"groups": "src1"}}
SOURCES = {"_claim_sources": {"src1": {"endpoint": URL, "access_token": "groups_token"}}}


@pytest.mark.parametrize("claims, found", [
    pytest.param({**NAMES, **SOURCES}, ClaimSource(URL, "groups_token"), id="distributed"),
    pytest.param({"_claim_names": {"groups": "src1"}, "_claim_sources": {"src1": {"endpoint": URL}}},
                 ClaimSource(URL, ""), id="no-access-token"),
    pytest.param({"groups": ["team1"], **NAMES, **SOURCES}, None, id="claim-present-wins"),
    pytest.param({"sub": "jane"}, None, id="no-claim-names"),
    pytest.param({"_claim_names": {"other": "src1"}, **SOURCES}, None, id="names-another-claim"),
    pytest.param({**NAMES, "_claim_sources": {"src1": {"JWT": "a.b.c"}}}, None, id="aggregated-not-resolved"),
])
def test_a_reference_is_read_as_kube_apiserver_reads_it(claims: dict[str, Any], found: ClaimSource | None) -> None:
    assert distributed_source(claims, "groups") == found


@pytest.mark.parametrize("claims, message", [
    pytest.param(NAMES, "no claim sources", id="no-claim-sources"),
    pytest.param({**NAMES, "_claim_sources": {"src2": {"endpoint": URL}}},
                 "_claim_names contained a source 'src1' missing in _claim_sources", id="missing-source"),
    pytest.param({"_claim_names": ["groups"], **SOURCES}, "error parsing distributed claim names", id="names-not-map"),
    pytest.param({**NAMES, "_claim_sources": "src1"}, "could not parse claim sources", id="sources-not-map"),
    pytest.param({**NAMES, "_claim_sources": {"src1": {"endpoint": "http://idp.example.com/groups"}}},
                 "the groups claim source is not an https URL", id="plain-http"),
])
def test_a_malformed_reference_refuses_the_token(claims: dict[str, Any], message: str) -> None:
    with pytest.raises(TokenRejected, match=message):
        distributed_source(claims, "groups")


def test_the_access_token_is_never_in_a_repr() -> None:
    assert "groups_token" not in repr(ClaimSource(URL, "groups_token"))
