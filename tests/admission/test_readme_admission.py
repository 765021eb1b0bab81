"""Every admission command the README shows runs as written, against a real ``serve``.

The commands are read from README.md itself: the ``sh`` block of "Admission webhooks" (a webhook's
certificate, the two example files with its caBundle pasted in, ``webhooks create/list/get``) and
the ``bcs-middleware webhooks`` lines of "Command-line client". They run in ``bash`` in a directory
holding a copy of ``examples/``, with the gateway, CA and admin token in the environment, as a
reader who followed the README would have them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import Gateway, served_gateway
from tests.support.servers import BIN

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def commands(text: str) -> list[str]:
    """The commands of the ``sh`` blocks in ``text``: comment lines dropped, continuations joined."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(line.strip())
    return found


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    with served_gateway(tmp_path / "gw", workers=1) as gw:
        yield gw


def run(gw: Gateway, cwd: Path, command: str) -> str:
    env = {**os.environ, "BCS_SERVER": gw.url, "BCS_CA_FILE": gw.ca_file, "BCS_TOKEN": gw.admin,
           "PATH": f"{BIN}:{os.environ['PATH']}", "XDG_CONFIG_HOME": str(cwd / ".config")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_the_admission_commands_of_the_readme_run_as_written(gateway: Gateway, tmp_path: Path) -> None:
    work = tmp_path / "reader"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    client = commands(section("Command-line client"))
    [create_cluster] = [c for c in client if c.startswith("bcs-middleware clusters create BCS-K8S-001")]
    run(gateway, work, create_cluster)

    walkthrough = commands(section("Admission webhooks"))
    assert any("webhooks create -f inject.yaml" in c for c in walkthrough)
    outputs = [run(gateway, work, command) for command in walkthrough]
    assert "inject-sidecar" in outputs[walkthrough.index("bcs-middleware webhooks list")]
    assert "sidecar-injector" in outputs[-1]  # webhooks get --cluster … mutating/sidecar
    stored = json.loads(gateway.call("GET", "/rest/admissionwebhooks")[1])["items"]
    [definition] = stored
    assert definition["admissionWebhooks"][0]["clientConfig"]["caBundle"].startswith("LS0t")  # a PEM, pasted

    # The "Command-line client" lines name the same files: removed, they create them again.
    run(gateway, work, "bcs-middleware webhooks delete inject-sidecar")
    run(gateway, work, "bcs-middleware webhooks delete --cluster BCS-K8S-001 mutating/sidecar")
    for command in (c for c in client if c.startswith("bcs-middleware webhooks")):
        run(gateway, work, command)
    assert [d["metadata"]["name"] for d in json.loads(gateway.call("GET", "/rest/admissionwebhooks")[1])["items"]] \
        == ["inject-sidecar"]
