"""``bcs-middleware`` as the client, run as a subprocess against a real served gateway.

Every subcommand, ``-o json``, the exit codes scripts rely on, ``login`` writing a
kubeconfig that the real kubectl uses through the tunnel, and the rules that a token
is printed only where the server hands one out and is never sent to another server.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import yaml

from bcs_middleware.cli.parser import build_parser
from tests.admission.conftest import bcs_definition, bcs_webhook, k8s_configuration, k8s_webhook
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, CLI, SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.kube import kubectl
from tests.support.polling import wait_for

CLUSTER = "cli-k8s-1"
HOOK_CA = trustme.CA()


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    alice: str
    tmp: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("cli")
    data = tmp / "data"
    ini = tmp / "gateway.ini"
    gateway_ini(ini, data, cluster_cache_ttl="1s", token_cache_ttl="1s")
    with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(data, args=["--config", str(ini)]) as gw:
        alice = gw.user("alice")
        register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem, token=alice)
        api.store.create("pods", {"metadata": {"name": "web", "namespace": "default"}})
        yield World(gw, api, alice, tmp)


def run(world: World, *args: str, token: str | None = ADMIN, home: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with the gateway in the environment (``token=None``: no BCS_TOKEN)."""
    home = home or world.tmp / "home-default"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BCS_", "KUBECONFIG", "XDG_"))}
    base.update(HOME=str(home), BCS_SERVER=world.gw.url, BCS_CA_FILE=world.gw.ca_file)
    if token is not None:
        base["BCS_TOKEN"] = token
    base.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=base, check=False)


def ok_json(world: World, *args: str, **kw) -> object:  # type: ignore[no-untyped-def]
    done = run(world, *args, "-o", "json", **kw)
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def test_every_subcommand_and_option_has_help_text() -> None:
    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}")

    client = {"users", "tokens", "clusters", "register-token", "webhooks", "kubeconfig", "login"}
    checked = 0
    for path, parser in walk(build_parser(), "bcs-middleware"):
        if len(path.split()) < 2 or path.split()[1] not in client:
            continue
        assert parser.description, f"{path} has no description"
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{path} {action.option_strings or action.dest} has no help"
        checked += 1
    assert checked >= 30


def test_users_and_tokens_round_trip_with_json_output(world: World) -> None:
    created = ok_json(world, "users", "create", "carl")
    assert created["name"] == "carl" and created["is_super_user"] is False
    assert ok_json(world, "users", "get", "carl")["id"] == created["id"]
    assert "carl" in [u["name"] for u in ok_json(world, "users", "list")]
    as_yaml = run(world, "users", "get", "carl", "-o", "yaml")
    assert as_yaml.returncode == 0 and yaml.safe_load(as_yaml.stdout) == created
    table = run(world, "users", "list")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == ["NAME", "ID"]

    issued = ok_json(world, "tokens", "create", "carl", "--expires-in", "3600")
    value = issued["user_token"]
    assert len(value) >= 40 and issued["expires_at"]
    listed = run(world, "tokens", "list", "carl", "-o", "json")
    assert listed.returncode == 0 and value not in listed.stdout
    assert [t["id"] for t in json.loads(listed.stdout)] == [issued["id"]]
    assert run(world, "users", "list", token=value).returncode == 4

    assert ok_json(world, "users", "promote", "carl")["is_super_user"] is True
    # The gateway's token cache holds the old principal for up to 1 s.
    wait_for(lambda: run(world, "users", "list", token=value).returncode == 0, 6, "the change never showed", step=0.3)
    assert ok_json(world, "users", "demote", "carl")["is_super_user"] is False
    revoked = ok_json(world, "tokens", "revoke", "carl", str(issued["id"]))
    assert revoked["revoked_at"]
    deleted = ok_json(world, "users", "delete", "carl")
    assert deleted["name"] == "carl" and deleted["tokens_revoked"] == 0
    assert run(world, "users", "get", "carl").returncode == 5
    superuser = ok_json(world, "users", "create", "root2", "--superuser")
    assert superuser["is_super_user"] is True


def test_clusters_permissions_and_register_tokens(world: World) -> None:
    bob = world.gw.user("bob")
    created = ok_json(world, "clusters", "create", "cli-k8s-2", "--project", "p9", token=bob)
    assert created == {**created, "id": "cli-k8s-2", "project_id": "p9", "cluster_type": "k8s"}
    listed = ok_json(world, "clusters", "list", token=bob)
    assert [(c["id"], c["permission"]) for c in listed] == [("cli-k8s-2", "edit")]
    assert ok_json(world, "clusters", "get", "cli-k8s-2", token=bob)["id"] == "cli-k8s-2"
    shown = run(world, "clusters", "get", "cli-k8s-2", token=bob)
    assert shown.returncode == 0 and "not reported yet" in shown.stdout

    granted = ok_json(world, "clusters", "permissions", "set", "cli-k8s-2", "alice", "view", token=bob)
    assert granted["permission"] == "view"
    perms = ok_json(world, "clusters", "permissions", "list", "cli-k8s-2", token=bob)
    assert sorted((p["user_name"], p["permission"]) for p in perms) == [("alice", "view"), ("bob", "edit")]
    assert "cli-k8s-2" in [c["id"] for c in ok_json(world, "clusters", "list", token=world.alice)]
    assert run(world, "clusters", "delete", "cli-k8s-2", token=world.alice).returncode == 4  # view only
    ok_json(world, "clusters", "permissions", "remove", "cli-k8s-2", "alice", token=bob)
    assert run(world, "clusters", "get", "cli-k8s-2", token=world.alice).returncode == 5

    created_token = ok_json(world, "register-token", "create", "cli-k8s-2", token=bob)["token"]
    plain = run(world, "register-token", "get", "cli-k8s-2", token=bob)
    assert plain.returncode == 0 and created_token not in plain.stdout and "created_at" in plain.stdout.lower()
    assert ok_json(world, "register-token", "get", "cli-k8s-2", "--show-token", token=bob)["token"] == created_token
    rotated = ok_json(world, "register-token", "rotate", "cli-k8s-2", token=bob)["token"]
    assert rotated != created_token
    assert ok_json(world, "register-token", "revoke", "cli-k8s-2", token=bob)["revoked"] is True
    assert run(world, "register-token", "get", "cli-k8s-2", token=bob).returncode == 5

    gone = ok_json(world, "clusters", "delete", "cli-k8s-2", token=bob)
    assert gone["deleted"]["permissions"] == {"bob": "edit"}
    assert ok_json(world, "clusters", "list", token=bob) == []


def test_webhooks_of_both_kinds_from_files(world: World, tmp_path: Path) -> None:
    bcs = tmp_path / "bcs.yaml"
    bcs.write_text(yaml.safe_dump(bcs_definition("inject", [bcs_webhook("sidecar.bcs-system", HOOK_CA)])))
    assert [d["metadata"]["name"] for d in ok_json(world, "webhooks", "create", "-f", str(bcs))] == ["inject"]
    table = run(world, "webhooks", "list")
    assert table.returncode == 0 and "inject" in table.stdout and "Create Application" in table.stdout
    assert ok_json(world, "webhooks", "get", "inject")["resourcesRef"]["operation"] == "Create"
    assert run(world, "webhooks", "create", "-f", str(bcs)).returncode == 6
    assert run(world, "webhooks", "list", token=world.alice).returncode == 4  # gateway-wide: superusers
    assert ok_json(world, "webhooks", "delete", "inject")
    # other workers within their refresh
    wait_for(lambda: ok_json(world, "webhooks", "list") == [], 6, "the change never showed", step=0.3)

    k8s = tmp_path / "k8s.yaml"
    k8s.write_text(yaml.safe_dump_all([
        k8s_configuration("sidecar", [k8s_webhook("sidecar.example.com", "sidecar.bcs-system", HOOK_CA)]),
        k8s_configuration("deny", [k8s_webhook("deny.example.com", "deny.bcs-system", HOOK_CA)], mutating=False),
    ]))
    made = ok_json(world, "webhooks", "create", "--cluster", CLUSTER, "-f", str(k8s), token=world.alice)
    assert [d["metadata"]["name"] for d in made] == ["sidecar", "deny"]
    names = [d["metadata"]["name"] for d in ok_json(world, "webhooks", "list", "--cluster", CLUSTER, token=world.alice)]
    assert sorted(names) == ["deny", "sidecar"]
    got = ok_json(world, "webhooks", "get", "--cluster", CLUSTER, "validating/deny", token=world.alice)
    assert got["kind"] == "ValidatingWebhookConfiguration"
    assert run(world, "webhooks", "get", "--cluster", CLUSTER, "deny", token=world.alice).returncode == 2
    ok_json(world, "webhooks", "delete", "--cluster", CLUSTER, "mutating/sidecar", token=world.alice)
    ok_json(world, "webhooks", "delete", "--cluster", CLUSTER, "validating/deny", token=world.alice)
    wait_for(lambda: ok_json(world, "webhooks", "list", "--cluster", CLUSTER, token=world.alice) == [], 6,
             "the change never showed", step=0.3)


@pytest.mark.parametrize(
    ("args", "token", "code"),
    [
        pytest.param(("clusters", "list"), "not-a-valid-token-" + "x" * 30, 3, id="401-bad-token"),
        pytest.param(("users", "list"), "ALICE", 4, id="403-not-superuser"),
        pytest.param(("clusters", "get", "no-such-cluster"), ADMIN, 5, id="404-missing"),
        pytest.param(("users", "create", "admin"), ADMIN, 6, id="409-exists"),
        pytest.param(("users", "create", "bad/name"), ADMIN, 1, id="400-invalid"),
        pytest.param(("clusters", "list"), None, 2, id="usage-no-token"),
        pytest.param(("clusters", "frobnicate"), ADMIN, 2, id="usage-unknown-subcommand"),
    ],
)
def test_exit_codes_and_errors_name_no_token(world: World, args: tuple[str, ...], token: str | None,
                                              code: int) -> None:
    token = world.alice if token == "ALICE" else token
    done = run(world, *args, token=token)
    assert done.returncode == code, done.stderr
    assert done.stdout == "" and done.stderr.strip()
    if token:
        assert token not in done.stderr
    if code in (1, 3, 4, 5, 6):
        assert "(HTTP 4" in done.stderr


def test_login_merges_contexts_that_kubectl_uses_and_keeps_the_others(world: World, tmp_path: Path) -> None:
    home = tmp_path / "home"
    kube = home / ".kube" / "config"
    kube.parent.mkdir(parents=True)
    other = {"apiVersion": "v1", "kind": "Config", "current-context": "other",
             "clusters": [{"name": "other", "cluster": {"server": "https://other.example:6443"}}],
             "users": [{"name": "other", "user": {"token": "other-token"}}],
             "contexts": [{"name": "other", "context": {"cluster": "other", "user": "other"}}]}
    kube.write_text(yaml.safe_dump(other))
    kube.chmod(0o644)

    done = run(world, "login", "-o", "json", token=world.alice, home=home)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["contexts"] == [f"bcs-{CLUSTER}"] and result["kubeconfig"] == str(kube)
    assert world.alice not in done.stdout + done.stderr
    merged = yaml.safe_load(kube.read_text())
    assert stat.S_IMODE(kube.stat().st_mode) == 0o600
    assert merged["current-context"] == "other"
    assert {c["name"] for c in merged["contexts"]} == {"other", f"bcs-{CLUSTER}"}
    assert next(u for u in merged["users"] if u["name"] == "other")["user"]["token"] == "other-token"
    config = home / ".config" / "bcs-middleware" / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600

    got = kubectl("--context", f"bcs-{CLUSTER}", "get", "pods", "-n", "default", "-o", "name", kubeconfig=kube)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["pod/web"]
    seen = [r for r in world.api.requests if r.path == "/api/v1/namespaces/default/pods"]
    assert seen and seen[-1].headers.get("Impersonate-User") == "alice"

    # Logged in: no flags or environment needed any more; a second login changes nothing else.
    saved = run(world, "clusters", "list", "-o", "json", token=None, home=home,
                env={"BCS_SERVER": "", "BCS_CA_FILE": ""})
    assert saved.returncode == 0, saved.stderr
    assert [c["id"] for c in json.loads(saved.stdout)] == [CLUSTER]
    again = run(world, "login", token=None, home=home, env={"BCS_SERVER": "", "BCS_CA_FILE": ""})
    assert again.returncode == 0, again.stderr
    assert len(yaml.safe_load(kube.read_text())["contexts"]) == 2


def test_the_saved_token_never_goes_to_another_server(world: World, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(world, "login", "--no-kubeconfig", token=world.alice, home=home).returncode == 0
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_text(world.api.ca_pem)  # the other server's TLS would verify
    done = run(world, "clusters", "list", token=None, home=home,
               env={"BCS_SERVER": world.api.url, "BCS_CA_FILE": str(other_ca)})
    assert done.returncode == 2 and "no token" in done.stderr
    assert not [r for r in world.api.requests if world.alice in (r.headers.get("Authorization") or "")]
    plain_http = world.gw.url.replace("https", "http")
    insecure = run(world, "clusters", "list", token=world.alice, env={"BCS_SERVER": plain_http})
    assert insecure.returncode == 2 and world.alice not in insecure.stderr


def test_kubeconfig_honours_the_first_kubeconfig_file(world: World, tmp_path: Path) -> None:
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    done = run(world, "kubeconfig", CLUSTER, token=world.alice,
               env={"KUBECONFIG": os.pathsep.join([str(first), str(second)])})
    assert done.returncode == 0, done.stderr
    assert not second.exists() and stat.S_IMODE(first.stat().st_mode) == 0o600
    document = yaml.safe_load(first.read_text())
    assert document["current-context"] == f"bcs-{CLUSTER}"
    got = kubectl("get", "pods", "-n", "default", "-o", "name", kubeconfig=first)
    assert got.returncode == 0 and got.stdout.split() == ["pod/web"], got.stderr
    assert run(world, "kubeconfig", "no-such-cluster", token=world.alice,
               env={"KUBECONFIG": str(first)}).returncode == 5


def test_transport_failures_exit_1_and_never_skip_tls_verification(world: World, tmp_path: Path) -> None:
    from tests.support.servers import free_port

    wrong_ca = tmp_path / "wrong-ca.pem"
    wrong_ca.write_text(world.api.ca_pem)
    for env, said in (
        ({"BCS_CA_FILE": str(wrong_ca)}, "TLS verification"),
        ({"BCS_CA_FILE": ""}, "TLS verification"),  # the system CAs do not know the gateway's
        ({"BCS_SERVER": f"https://127.0.0.1:{free_port()}"}, "cannot connect"),
    ):
        done = run(world, "clusters", "list", token=world.alice, env=env)
        assert done.returncode == 1 and said in done.stderr, (env, done.stderr)
        assert world.alice not in done.stderr + done.stdout
