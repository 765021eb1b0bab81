"""Impersonation is a value; one function renders it as kube-apiserver's headers."""

from __future__ import annotations

from bcs_middleware.core.impersonation import Impersonation, impersonation_headers


def test_a_user_is_rendered_as_before_groups_in_order() -> None:
    value = Impersonation.of_user("alice", ("dev", "ops", "dev-leads"))
    assert impersonation_headers(value) == (
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "system:authenticated"),
        ("Impersonate-Group", "dev"),
        ("Impersonate-Group", "ops"),
        ("Impersonate-Group", "dev-leads"),
    )


def test_a_user_without_groups_is_still_authenticated() -> None:
    assert impersonation_headers(Impersonation.of_user("bob")) == (
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
    impersonation_headers(Impersonation.of_user("dana", ("x",)))
    impersonation_headers(Impersonation.of_user("dana", ("x",)))
    assert impersonation_headers.cache_info().hits == 1
