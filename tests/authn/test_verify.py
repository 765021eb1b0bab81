"""The JWT checks and claim mappings, with vectors from kube-apiserver's own tests.

Cases follow ``staging/src/k8s.io/apiserver/plugin/pkg/authenticator/token/oidc/oidc_test.go``
(claims, expected user or error) and ``pkg/apis/apiserver/validation/validation_test.go``;
tokens are signed here with a fresh RSA key whose JWK is the issuer's key set.
"""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bcs_middleware.authn.cel import EvaluationError, compile_expression, evaluate
from bcs_middleware.authn.config import parse_configuration
from bcs_middleware.authn.verify import TokenRejected, UnknownKey, public_keys, verify_token
from bcs_middleware.core.errors import ConfigError

ISSUER = "https://auth.example.com"
NOW = 1_700_000_000.0
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
JWK = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key())), "kid": "k1", "use": "sig"}
KEYS = public_keys({"keys": [JWK]})


def _config(**jwt_entry: Any) -> Any:
    entry = {"issuer": {"url": ISSUER, "audiences": ["my-client"]},
             "claimMappings": {"username": {"claim": "username", "prefix": ""}}, **jwt_entry}
    return parse_configuration({"apiVersion": "apiserver.config.k8s.io/v1beta1", "kind": "AuthenticationConfiguration",
                                "jwt": [entry]}).jwt[0]


def _token(claims: dict[str, Any], *, key: Any = KEY, alg: str = "RS256", kid: str | None = "k1") -> str:
    base = {"iss": ISSUER, "aud": "my-client", "exp": NOW + 600}
    return jwt.encode({**base, **claims}, key, algorithm=alg, headers={"kid": kid} if kid else None)


def test_a_plain_username_claim() -> None:
    identity = verify_token(_token({"username": "jane"}), _config(), KEYS, NOW)
    assert (identity.username, identity.groups, identity.uid) == ("jane", (), "")


def test_username_prefix_and_groups_as_a_single_string() -> None:
    config = _config(claimMappings={"username": {"claim": "username", "prefix": "oidc:"},
                                    "groups": {"claim": "groups", "prefix": "oidc:"}})
    identity = verify_token(_token({"username": "jane", "groups": "team1"}), config, KEYS, NOW)
    assert identity.username == "oidc:jane" and identity.groups == ("oidc:team1",)


def test_email_must_be_verified_when_the_claim_says_so() -> None:
    config = _config(claimMappings={"username": {"claim": "email", "prefix": ""}})
    assert verify_token(_token({"email": "jane@example.com", "email_verified": True}), config, KEYS, NOW).username \
        == "jane@example.com"
    assert verify_token(_token({"email": "jane@example.com"}), config, KEYS, NOW).username == "jane@example.com"
    with pytest.raises(TokenRejected, match="email not verified"):
        verify_token(_token({"email": "jane@example.com", "email_verified": False}), config, KEYS, NOW)


def test_expression_mappings() -> None:
    config = _config(
        claimMappings={"username": {"expression": "'k8s-' + claims.username"},
                       "groups": {"expression": "claims.roles.split(',')"},
                       "uid": {"expression": "claims.uid"},
                       "extra": [{"key": "example.org/foo", "valueExpression": "claims.foo"},
                                 {"key": "example.org/bar", "valueExpression": "claims.bar"},
                                 {"key": "example.org/empty", "valueExpression": "''"}]})
    identity = verify_token(_token({"username": "jane", "roles": "foo,bar", "uid": "1234", "foo": "bar",
                                    "bar": ["baz", "qux", ""]}), config, KEYS, NOW)
    assert identity.username == "k8s-jane" and identity.groups == ("foo", "bar") and identity.uid == "1234"
    assert identity.extra == (("example.org/foo", ("bar",)), ("example.org/bar", ("baz", "qux")))


def test_claim_validation_rules() -> None:
    config = _config(claimValidationRules=[{"claim": "hd", "requiredValue": "example.com"},
                                           {"expression": "claims.exp - claims.nbf <= 86400",
                                            "message": "total token lifetime must not exceed 24 hours"}])
    ok = {"username": "jane", "hd": "example.com", "nbf": NOW - 10}
    assert verify_token(_token(ok), config, KEYS, NOW).username == "jane"
    with pytest.raises(TokenRejected, match="required claim hd value does not match"):
        verify_token(_token({**ok, "hd": "other.com"}), config, KEYS, NOW)
    with pytest.raises(TokenRejected, match="required claim hd not present"):
        verify_token(_token({"username": "jane", "nbf": NOW}), config, KEYS, NOW)
    with pytest.raises(TokenRejected, match="must not exceed 24 hours"):
        verify_token(_token({**ok, "nbf": NOW - 90000}), config, KEYS, NOW)


def test_an_expression_error_is_never_true() -> None:
    # (CEL's ``||`` absorbs an error when the other side is true, in cel-go as here: that is the language.)
    for expression in ("claims.missing == 'x'", "!(claims.missing == 'x')", "claims.username.size() / 0 == 1"):
        config = _config(claimValidationRules=[{"expression": expression}])
        with pytest.raises(TokenRejected, match="error evaluating claim validation"):
            verify_token(_token({"username": "jane"}), config, KEYS, NOW)
    # compile.go: a validation rule must be typed bool when the file loads ("must evaluate to bool").
    for expression in ("'true'", "claims.email_verified", "claims.groups"):
        with pytest.raises(ConfigError, match="must evaluate to bool but got"):
            _config(claimValidationRules=[{"expression": expression}])
        with pytest.raises(ConfigError, match="must evaluate to bool but got"):
            _config(userValidationRules=[{"expression": expression.replace("claims", "user")}])


#: kube-apiserver's documented rules for the system: prefix (reference/access-authn-authz/authentication.md).
SYSTEM_RULES = [{"expression": "!user.username.startsWith('system:')",
                 "message": "username cannot used reserved system: prefix"},
                {"expression": "user.groups.all(group, !group.startsWith('system:'))",
                 "message": "groups cannot used reserved system: prefix"}]
#: test/integration/apiserver/oidc/oidc_test.go ("user validation rule fails"): roles "foo,bar" and
#: other_roles "baz,qux" mapped to groups with a prefix.
ROLES = {"username": "john_doe", "roles": "foo,bar", "other_roles": "baz,qux"}


def _roles_as_groups(prefix: str) -> dict[str, Any]:
    return {"username": {"expression": "'k8s-' + claims.username"},
            "groups": {"expression": '(claims.roles.split(",") + claims.other_roles.split(","))'
                                     f'.map(role, "{prefix}" + role)'}}


def test_system_names_are_left_to_user_validation_rules_as_kube_apiserver_does() -> None:
    # No rule: kube-apiserver takes system: names and groups from a JWT as they are.
    identity = verify_token(_token({"username": "system:admin"}), _config(), KEYS, NOW)
    assert identity.username == "system:admin"
    identity = verify_token(_token(ROLES), _config(claimMappings=_roles_as_groups("system:")), KEYS, NOW)
    assert (identity.username, identity.groups) == ("k8s-john_doe", ("system:foo", "system:bar", "system:baz",
                                                                      "system:qux"))
    # The integration test's passing case, and its failing one with the documented rule.
    identity = verify_token(_token(ROLES), _config(claimMappings=_roles_as_groups("prefix:"),
                                                   userValidationRules=SYSTEM_RULES), KEYS, NOW)
    assert identity.groups == ("prefix:foo", "prefix:bar", "prefix:baz", "prefix:qux")
    with pytest.raises(TokenRejected, match="groups cannot used reserved system: prefix"):
        verify_token(_token(ROLES), _config(claimMappings=_roles_as_groups("system:"),
                                            userValidationRules=SYSTEM_RULES), KEYS, NOW)
    with pytest.raises(TokenRejected, match="username cannot used reserved system: prefix"):
        verify_token(_token({"username": "system:admin"}), _config(userValidationRules=SYSTEM_RULES), KEYS, NOW)


@pytest.mark.parametrize("mappings", [
    pytest.param({"username": {"claim": "username", "prefix": ""}, "groups": {"claim": "groups", "prefix": ""}},
                 id="claim"),
    pytest.param({"username": {"claim": "username", "prefix": ""}, "groups": {"expression": "claims.groups"}},
                 id="expression"),
])
def test_system_masters_is_never_taken_from_a_token(mappings: dict[str, Any]) -> None:
    token = _token({"username": "mallory", "groups": ["dev", "system:masters"]})
    with pytest.raises(TokenRejected, match="group system:masters is never accepted from an identity provider"):
        verify_token(token, _config(claimMappings=mappings), KEYS, NOW)
    # Only that group: another system: group is the rules' business, as in kube-apiserver.
    assert verify_token(_token({"username": "mallory", "groups": ["system:nodes"]}),
                        _config(claimMappings=mappings), KEYS, NOW).groups == ("system:nodes",)


@pytest.mark.parametrize(("claims", "message"), [
    pytest.param({"iss": "https://other.example.com"}, "issued by", id="issuer"),
    pytest.param({"aud": "not-my-client"}, "audience", id="audience"),
    pytest.param({"exp": NOW - 1}, "token expired at", id="expired"),
    pytest.param({"exp": None}, "no valid exp", id="no-exp"),
    pytest.param({"nbf": NOW + 301}, "not valid before", id="nbf-beyond-skew"),
])
def test_registered_claims(claims: dict[str, Any], message: str) -> None:
    with pytest.raises(TokenRejected, match=message):
        verify_token(_token({"username": "jane", **claims}), _config(), KEYS, NOW)


def test_nbf_within_the_skew_is_accepted() -> None:
    assert verify_token(_token({"username": "jane", "nbf": NOW + 299}), _config(), KEYS, NOW).username == "jane"


def test_only_asymmetric_algorithms_and_published_keys() -> None:
    hs = jwt.encode({"iss": ISSUER, "aud": "my-client", "exp": NOW + 600, "username": "x"}, "secret" * 6,
                    algorithm="HS256")
    with pytest.raises(TokenRejected, match="HS256"):
        verify_token(hs, _config(), KEYS, NOW)
    with pytest.raises(UnknownKey):
        verify_token(_token({"username": "jane"}, kid="k2"), _config(), KEYS, NOW)
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(UnknownKey):  # an EC token, and the issuer publishes RSA only
        verify_token(_token({"username": "jane"}, key=other, alg="ES256"), _config(), KEYS, NOW)
    # A token without kid is tried against every key (oidc-provider-mock signs so).
    assert verify_token(_token({"username": "jane"}, kid=None), _config(), KEYS, NOW).username == "jane"
    assert public_keys({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}) == ()


@pytest.mark.parametrize(("entry", "message"), [
    pytest.param({"issuer": {"url": "http://auth.example.com", "audiences": ["a"]}}, "URL scheme must be https",
                 id="http-issuer"),
    pytest.param({"issuer": {"url": ISSUER, "audiences": []}}, "at least one", id="no-audience"),
    pytest.param({"issuer": {"url": ISSUER, "audiences": ["a", "b"]}}, "must be MatchAny", id="policy"),
    pytest.param({"issuer": {"url": ISSUER, "audiences": ["a"], "discoveryURL": ISSUER + "/"}},
                 "must be different from URL", id="discovery-same"),
    pytest.param({"claimMappings": {"username": {"claim": "sub"}}}, "prefix is required", id="prefix-required"),
    pytest.param({"claimMappings": {"username": {"expression": "claims.sub", "prefix": "x"}}},
                 "may not be specified when expression is set", id="prefix-with-expression"),
    pytest.param({"claimMappings": {"username": {"expression": "claims.email"}}},
                 "claims.email_verified must be used", id="email-without-verified"),
    pytest.param({"claimMappings": {"username": {"claim": "sub", "prefix": ""},
                                    "extra": [{"key": "k8s.io/foo", "valueExpression": "'x'"}]}},
                 "reserved for Kubernetes use", id="reserved-extra-key"),
    pytest.param({"claimMappings": {"username": {"claim": "sub", "prefix": ""},
                                    "extra": [{"key": "example.org/Foo", "valueExpression": "'x'"}]}},
                 "must be lowercase", id="uppercase-extra-key"),
    pytest.param({"claimValidationRules": [{"claim": "a", "expression": "true"}]},
                 "claim and expression can't both be set", id="claim-and-expression"),
    pytest.param({"claimMappings": {"username": {"expression": "claims.("}}}, "compilation failed",
                 id="syntax"),
    pytest.param({"claimMappings": {"username": {"expression": "user.username"}}}, "undeclared reference",
                 id="wrong-variable"),
    pytest.param({"surprise": True}, "unknown field", id="strict"),
])
def test_configuration_is_validated_as_the_apiserver_does(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**entry)


def test_username_expression_reading_email_with_email_verified_is_accepted() -> None:
    config = _config(claimMappings={"username": {
        "expression": "claims.email_verified ? claims.email : claims.sub"}})
    assert verify_token(_token({"email": "j@x", "email_verified": True, "sub": "1"}), config, KEYS, NOW).username \
        == "j@x"


def test_cel_cost_is_bounded_and_measured() -> None:
    deep = "claims.a.all(x, claims.a.all(y, claims.a.all(z, true)))"
    with pytest.raises(ValueError, match="nested 3 deep"):
        compile_expression(deep, "claims")
    quadratic = compile_expression("claims.a.all(x, claims.a.exists(y, y == x))", "claims", "bool")
    assert evaluate(quadratic, {"a": [str(i) for i in range(10)]}) is True
    # Past the iteration budget the evaluation fails — and the failure is not absorbed by ``||``.
    with pytest.raises(EvaluationError, match="cost budget exceeded"):
        evaluate(quadratic, {"a": [str(i) for i in range(200)]})
    absorbing = compile_expression("claims.a.all(x, claims.a.exists(y, y == x)) || true", "claims", "bool")
    with pytest.raises(EvaluationError, match="cost budget exceeded"):
        evaluate(absorbing, {"a": [str(i) for i in range(200)]})
    with pytest.raises(EvaluationError, match="larger than"):
        evaluate(quadratic, {"a": ["x" * 1000] * 100})


def test_map_and_filter_range_over_bounded_lists() -> None:
    # cel-cpp copies the list a map/filter builds at each step: quadratic, so bounded by the input.
    groups = [f"g{i}" for i in range(1000)]
    for source in ("claims.groups.map(g, 'oidc:' + g)", "claims.groups.filter(g, g != 'x')"):
        mapped = compile_expression(source, "claims")
        assert len(evaluate(mapped, {"groups": groups})) == 1000
        with pytest.raises(EvaluationError, match="cost budget exceeded: map/filter over a list of more than 1000"):
            evaluate(mapped, {"groups": [*groups, "one more"]})
        with pytest.raises(EvaluationError, match="cost budget exceeded"):
            evaluate(mapped, {"groups": ["a"], "nested": {"deep": [[*groups, "x"]]}})
    # all/exists accumulate a boolean: linear, no such bound.
    assert evaluate(compile_expression("claims.groups.all(g, g != 'x')", "claims", "bool"),
                    {"groups": groups * 5}) is True


def _optional(field: str, expression: str) -> Any:
    mappings: dict[str, Any] = {"username": {"claim": "username", "prefix": ""}}
    entry: dict[str, Any] = {"claimMappings": mappings}
    if field == "claimValidationRules":
        entry["claimValidationRules"] = [{"expression": expression}]
    else:
        mappings[field] = {"expression": expression}
    return _config(**entry)


def test_cel_optional_syntax_evaluates_as_kube_apiserver_does() -> None:
    # apis/apiserver/types.go: the rule that matches the automatic email_verified check.
    rule = _optional("claimValidationRules", "claims.?email_verified.orValue(true) == true")
    assert verify_token(_token({"username": "jane"}), rule, KEYS, NOW).username == "jane"
    assert verify_token(_token({"username": "jane", "email_verified": True}), rule, KEYS, NOW).username == "jane"
    with pytest.raises(TokenRejected, match="claim validation rule failed"):
        verify_token(_token({"username": "jane", "email_verified": False}), rule, KEYS, NOW)
    groups = _optional("groups", "claims.?groups.orValue([])")
    assert verify_token(_token({"username": "jane"}), groups, KEYS, NOW).groups == ()
    assert verify_token(_token({"username": "jane", "groups": ["a", "b"]}), groups, KEYS, NOW).groups == ("a", "b")
    listed = _optional("groups", "[?claims.?team]")
    assert verify_token(_token({"username": "jane"}), listed, KEYS, NOW).groups == ()
    assert verify_token(_token({"username": "jane", "team": "blue"}), listed, KEYS, NOW).groups == ("blue",)
    uid = _optional("uid", "optional.of(claims.username).value()")
    assert verify_token(_token({"username": "jane"}), uid, KEYS, NOW).uid == "jane"
    extra = _config(claimMappings={"username": {"claim": "username", "prefix": ""}, "extra": [
        {"key": "example.com/team", "valueExpression": "claims.?team.orValue('none')"}]})
    assert verify_token(_token({"username": "jane"}), extra, KEYS, NOW).extra == (("example.com/team", ("none",)),)
    # An optional is no username: the mapping's result must be a string.
    unwrapped = _optional("username", "claims.?username")
    with pytest.raises(TokenRejected, match="username"):
        verify_token(_token({"username": "jane"}), unwrapped, KEYS, NOW)


def test_an_optional_select_of_email_counts_as_reading_it() -> None:
    # validation_test.go: claims.?email in the username expression needs claims.email_verified somewhere.
    with pytest.raises(ConfigError, match=r"claims\.email_verified must be used"):
        _optional("username", "claims.?email.orValue('')")
    config = _config(claimMappings={"username": {"expression": "claims.?email.orValue('')"}},
                     claimValidationRules=[{"expression": "claims.?email_verified.orValue(false) == true"}])
    assert verify_token(_token({"email": "j@x", "email_verified": True}), config, KEYS, NOW).username == "j@x"


def test_user_fields_are_those_of_kubernetes_user_info() -> None:
    with pytest.raises(ConfigError, match="undefined field 'name'"):
        _config(userValidationRules=[{"expression": "user.name != 'x'"}])
    config = _config(userValidationRules=[{"expression": "user.uid == '' && size(user.extra) == 0 && "
                                                         "user.groups.all(g, g != 'x') && user.username != ''"}])
    assert verify_token(_token({"username": "jane"}), config, KEYS, NOW).username == "jane"


def test_a_question_mark_inside_a_string_is_not_optional_syntax() -> None:
    config = _config(claimValidationRules=[{"expression": "claims.note != 'a.?b' && claims.note != \"[?\""}])
    assert verify_token(_token({"username": "jane", "note": "x"}), config, KEYS, NOW).username == "jane"
    with pytest.raises(ConfigError, match="compilation failed") as refused:
        _config(claimValidationRules=[{"expression": "claims.note == 'a.?b' ||"}])
    assert "Syntax error" in str(refused.value)
