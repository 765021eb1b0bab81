"""The limits file: defaults, overrides, and mistakes named at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.limits.settings import LimitSettings, UserLimits, load, parse


def test_an_empty_file_is_every_default(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("")
    assert load(path) == LimitSettings()
    assert LimitSettings().enabled and LimitSettings().user.rate


def test_overrides_inherit_the_user_defaults_of_the_file() -> None:
    settings = parse({"user": {"rate": 10, "burst": 20}, "users": {"argocd": {"inflight": 64}},
                      "groups": {"bots": 8}, "exempt": {"users": ["prom"], "routes": ["health"]},
                      "queue": {"wait": "500ms"}, "cluster": {"inflight": None},
                      "clients": {"upstream_idle_per_cluster": 100}})
    assert settings.clients.upstream_idle_per_cluster == 100 and settings.clients.rbac_sync_workers == 8
    assert settings.for_user("argocd") == UserLimits(rate=10.0, burst=20, inflight=64, long_running=100)
    assert settings.for_user("alice") == UserLimits(rate=10.0, burst=20, inflight=16, long_running=100)
    assert settings.groups == (("bots", 8),)
    assert settings.exempt_users == {"prom"} and settings.exempt_routes == {"health"}
    assert settings.queue.wait == 0.5 and settings.cluster.inflight is None
    assert settings.queue.refusal_delay == 1.0  # the default
    assert parse({"queue": {"refusal_delay": 0}}).queue.refusal_delay == 0.0  # refusals at once
    assert parse({"queue": {"refusal_delay": "250ms"}}).queue.refusal_delay == 0.25
    assert settings.queue.turn_after == 2  # the default
    assert parse({"queue": {"turn_after": 8}}).queue.turn_after == 8
    assert parse({"queue": {"turn_after": None}}).queue.turn_after is None  # never wait a turn


@pytest.mark.parametrize("document, message", [
    pytest.param({"user": {"rat": 1}}, "user: unknown key 'rat'", id="typo"),
    pytest.param({"user": {"inflight": 0}}, "user.inflight: must be at least 1", id="zero-cap"),
    pytest.param({"user": {"burst": None}}, "user.burst: cannot be null", id="null-burst"),
    pytest.param({"user": {"rate": True}}, "user.rate: not a number", id="bool"),
    pytest.param({"queue": {"wait": "soon"}}, "queue.wait: not a duration", id="duration"),
    pytest.param({"queue": {"refusal_delay": -1}}, "queue.refusal_delay: must not be negative", id="delay"),
    pytest.param({"queue": {"turn_after": 0}}, "queue.turn_after: must be at least 1", id="turn-after"),
    pytest.param({"exempt": {"routes": ["kubernetes", "helth"]}}, "unknown route kind 'helth'", id="route"),
    pytest.param({"groups": {"ops": -1}}, "groups.ops: must be at least 1", id="group"),
    pytest.param({"limits": {}}, "unknown key 'limits'", id="top"),
    pytest.param([1, 2], "expected a mapping", id="list"),
    pytest.param({"clients": {"rbac_sync_workers": 0}}, "clients.rbac_sync_workers: must be at least 1",
                 id="clients"),
])
def test_mistakes_are_named(document: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(document)


def test_a_file_that_is_not_yaml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("user: [unclosed\n")
    with pytest.raises(ConfigError, match="not YAML"):
        load(path)


def test_the_readme_example_is_a_valid_file(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Fair share"):]
    example = section[section.index("```yaml\n") + len("```yaml\n"):section.index("```\n", section.index("```yaml"))]
    path = tmp_path / "limits.yaml"
    path.write_text(example)
    settings = load(path)
    assert settings.for_user("argocd").inflight == 64 and settings.groups == (("ci-bots", 32),)
    # The README's table and the example state the defaults.
    defaults = LimitSettings()
    assert settings.user == defaults.user and settings.cluster == defaults.cluster and settings.queue == defaults.queue
    assert settings.clients == defaults.clients and settings.discovery_cache == defaults.discovery_cache
