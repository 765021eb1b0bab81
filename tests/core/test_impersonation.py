"""Impersonation is a value; one function renders it as kube-apiserver's headers."""

from __future__ import annotations

from bcs_middleware.core import environ as env
from bcs_middleware.core.impersonation import Impersonation, impersonation_headers


def _of(name: str, groups: tuple[str, ...] = ()) -> Impersonation:
    return Impersonation(name, env.User(1, name, groups=groups).kubernetes_groups)


def test_a_user_is_rendered_as_before_groups_in_order() -> None:
    value = _of("alice", ("dev", "ops", "dev-leads"))
    assert impersonation_headers(value) == (
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "system:authenticated"),
        ("Impersonate-Group", "dev"),
        ("Impersonate-Group", "ops"),
        ("Impersonate-Group", "dev-leads"),
    )


def test_a_user_without_groups_is_still_authenticated() -> None:
    assert impersonation_headers(_of("bob")) == (
        ("Impersonate-User", "bob"), ("Impersonate-Group", "system:authenticated"),
    )


def test_uid_and_extra_follow_the_apiserver_names() -> None:
    value = Impersonation("carol", ("g",), uid="1234",
                          extra=(("scopes", ("view", "edit")), ("example.com/team", ("a b",))))
    assert impersonation_headers(value) == (
        ("Impersonate-User", "carol"),
        ("Impersonate-Uid", "1234"),
        ("Impersonate-Group", "g"),
        ("Impersonate-Extra-scopes", "view"),
        ("Impersonate-Extra-scopes", "edit"),
        ("Impersonate-Extra-example.com%2Fteam", "a b"),
    )


def test_equal_values_render_once() -> None:
    impersonation_headers.cache_clear()
    impersonation_headers(_of("dana", ("x",)))
    impersonation_headers(_of("dana", ("x",)))
    assert impersonation_headers.cache_info().hits == 1


def test_the_anonymous_user_is_unauthenticated_never_authenticated() -> None:
    # impersonation.go: an impersonated system:anonymous gets system:unauthenticated, not
    # system:authenticated (which every RBAC rule for "any signed-in user" names).
    user = env.ANONYMOUS_USER
    assert impersonation_headers(Impersonation(user.name, user.kubernetes_groups)) == (
        ("Impersonate-User", "system:anonymous"), ("Impersonate-Group", "system:unauthenticated"),
    )
    assert env.kubernetes_identity(None) == ("system:anonymous", ("system:unauthenticated",))
