"""Listing and removing users and clusters, and the superuser flag (SQLite and PostgreSQL)."""

from __future__ import annotations

import base64

import trustme

CA_PEM = trustme.CA().cert_pem.bytes().decode()
CA_BUNDLE = base64.b64encode(CA_PEM.encode()).decode()


def _cluster(api, cluster_id: str, token) -> None:  # type: ignore[no-untyped-def]
    response = api.call("POST", "/rest/clusters/bcs", token=token,
                        json={"id": cluster_id, "project_id": "p", "cluster_type": "k8s"})
    assert response.status_code == 201, response.get_json()


def test_superuser_lists_users_and_others_may_not(api) -> None:  # type: ignore[no-untyped-def]
    _, token = api.new_user("zed")
    names = [u["name"] for u in api.call("GET", "/rest/users/").get_json()]
    assert names == ["admin", "zed"]
    refused = api.call("GET", "/rest/users/", token=token)
    assert refused.status_code == 403 and refused.get_json()["code_name"] == "FORBIDDEN"
    assert api.call("GET", "/rest/users/", token=None).status_code == 401


def test_promote_and_demote_are_audited_and_the_last_superuser_stays(api) -> None:  # type: ignore[no-untyped-def]
    _, token = api.new_user("ops")
    self_promotion = api.call("PUT", "/rest/users/ops", token=token, json={"is_super_user": True})
    assert self_promotion.status_code == 403
    assert api.store.find_user("ops").is_superuser is False
    promoted = api.call("PUT", "/rest/users/ops", json={"is_super_user": True})
    assert promoted.status_code == 200 and promoted.get_json()["is_super_user"] is True
    assert api.call("GET", "/rest/users/", token=token).status_code == 200  # now a superuser
    # ops demotes admin, then cannot demote themselves: they are the last superuser.
    assert api.call("PUT", "/rest/users/admin", token=token, json={"is_super_user": False}).status_code == 200
    last = api.call("PUT", "/rest/users/ops", token=token, json={"is_super_user": False})
    assert last.status_code == 409 and last.get_json()["code_name"] == "LAST_SUPERUSER"
    assert api.store.find_user("ops").is_superuser is True
    actions = [(a.actor, a.action, a.target) for a in api.store.list_audit()]
    assert ("admin", "user.update", "user:ops") in actions and ("ops", "user.update", "user:admin") in actions


def test_bad_update_bodies_are_400(api) -> None:  # type: ignore[no-untyped-def]
    api.new_user("ops")
    for body in ({"is_super_user": "yes"}, {}, {"is_super_user": True, "name": "x"}):
        response = api.call("PUT", "/rest/users/ops", json=body)
        assert response.status_code == 400, body
    assert api.call("PUT", "/rest/users/nobody", json={"is_super_user": True}).status_code == 404
    assert api.store.find_user("ops").is_superuser is False


def test_deleting_a_user_takes_their_tokens_and_permissions(api) -> None:  # type: ignore[no-untyped-def]
    _, alice = api.new_user("alice")
    _, bob = api.new_user("bob")
    _cluster(api, "c1", alice)
    api.call("PUT", "/rest/clusters/c1/permissions/bob", token=alice, json={"permission": "edit"})
    deleted = api.call("DELETE", "/rest/users/bob")
    assert deleted.status_code == 200, deleted.get_json()
    body = deleted.get_json()
    assert body["tokens_revoked"] == 1 and body["permissions_removed"] == [{"cluster_id": "c1", "permission": "edit"}]
    assert api.call("GET", "/rest/clusters/", token=bob).status_code == 401
    assert api.store.find_user("bob") is None
    assert [p.user_name for p in api.store.list_cluster_permissions("c1")] == ["alice"]
    assert api.call("DELETE", "/rest/users/bob").status_code == 404
    # A user of the same name later starts with nothing.
    api.new_user("bob")
    assert api.store.list_cluster_permissions("c1")[0].user_name == "alice"
    assert any(a.action == "user.delete" and a.target == "user:bob" for a in api.store.list_audit())


def test_nobody_deletes_themselves_or_the_last_superuser_and_users_delete_nobody(api) -> None:  # type: ignore[no-untyped-def]
    _, alice = api.new_user("alice")
    api.new_user("bob")
    refused = api.call("DELETE", "/rest/users/bob", token=alice)
    assert refused.status_code == 403 and api.store.find_user("bob") is not None
    me = api.call("DELETE", "/rest/users/admin")
    assert me.status_code == 409 and me.get_json()["code_name"] == "CANNOT_DELETE_SELF"
    api.call("PUT", "/rest/users/alice", json={"is_super_user": True})
    api.call("PUT", "/rest/users/admin", token=alice, json={"is_super_user": False})
    api.call("PUT", "/rest/users/admin", token=alice, json={"is_super_user": True})
    assert api.call("DELETE", "/rest/users/alice").status_code == 200
    assert api.store.find_user("admin").is_superuser is True


def test_cluster_list_shows_what_the_caller_may_see(api) -> None:  # type: ignore[no-untyped-def]
    _, alice = api.new_user("alice")
    _, bob = api.new_user("bob")
    _, carol = api.new_user("carol")
    _cluster(api, "a1", alice)
    _cluster(api, "a2", alice)
    _cluster(api, "b1", bob)
    api.call("PUT", "/rest/clusters/a2/permissions/carol", token=alice, json={"permission": "view"})

    def listed(token: str) -> list[tuple[str, str]]:
        response = api.call("GET", "/rest/clusters/", token=token)
        assert response.status_code == 200
        return [(c["id"], c["permission"]) for c in response.get_json()]

    assert listed(alice) == [("a1", "edit"), ("a2", "edit")]
    assert listed(bob) == [("b1", "edit")]
    assert listed(carol) == [("a2", "view")]
    assert [c for c, _ in listed(api.tokens[0])] == ["a1", "a2", "b1"]
    assert api.call("GET", "/rest/clusters", token=None).status_code == 401


def test_deleting_a_cluster_takes_everything_hanging_off_it(api) -> None:  # type: ignore[no-untyped-def]
    _, alice = api.new_user("alice")
    _, bob = api.new_user("bob")
    _cluster(api, "c1", alice)
    register = api.call("POST", "/rest/clusters/c1/register_tokens", token=alice).get_json()["token"]
    api.tokens.append(register)
    report = api.call("PUT", "/rest/clusters/c1/credentials", token=register, json={
        "server_addresses": "https://10.0.0.1:6443", "cacert_data": CA_PEM, "user_token": "sa-token-0123456789abcdef"})
    assert report.status_code == 200
    api.call("PUT", "/rest/clusters/c1/permissions/bob", token=alice, json={"permission": "view"})
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "deny"},
        "webhooks": [{"name": "deny.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                      "clientConfig": {"url": "https://127.0.0.1:1/", "caBundle": CA_BUNDLE},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["configmaps"]}]}],
    }
    created = api.call("POST", "/rest/clusters/c1/admissionwebhookconfigurations", token=alice, json=webhook)
    assert created.status_code == 201, created.get_json()

    # bob (view) may not delete it; a stranger gets the 404 of a cluster that does not exist.
    assert api.call("DELETE", "/rest/clusters/c1", token=bob).status_code == 403
    _, mallory = api.new_user("mallory")
    hidden = api.call("DELETE", "/rest/clusters/c1", token=mallory)
    assert hidden.status_code == 404 and hidden.get_json()["code_name"] == "CLUSTER_NOT_FOUND"

    deleted = api.call("DELETE", "/rest/clusters/c1", token=alice)
    assert deleted.status_code == 200, deleted.get_json()
    gone = deleted.get_json()["deleted"]
    assert gone == {"register_token": True, "credentials": True, "permissions": {"alice": "edit", "bob": "view"},
                    "admission_configurations": ["ValidatingWebhookConfiguration/deny"]}
    assert api.store.find_cluster("c1") is None and api.store.get_credentials("c1") is None
    assert api.store.authenticate_register_token(register) is None
    again = api.call("PUT", "/rest/clusters/c1/credentials", token=register, json={
        "server_addresses": "https://10.0.0.2:6443", "cacert_data": CA_PEM, "user_token": "sa-token-0123456789abcdef"})
    assert again.status_code == 401
    # A new cluster of the same id starts with none of it.
    _cluster(api, "c1", bob)
    assert [p.user_name for p in api.store.list_cluster_permissions("c1")] == ["bob"]
    listed = api.call("GET", "/rest/clusters/c1/admissionwebhookconfigurations", token=bob).get_json()
    assert listed == {"items": []}
    audit = [a for a in api.store.list_audit() if a.action == "cluster.delete"]
    assert audit and audit[0].actor == "alice" and register not in str(audit[0].detail)
