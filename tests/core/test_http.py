"""The one decision whether a request is a connection upgrade (admission and the proxy both obey it)."""

from __future__ import annotations

from typing import Any

import pytest

from bcs_middleware.core.environ import UPGRADE
from bcs_middleware.core.http import upgrade_protocol


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"HTTP_CONNECTION": "Upgrade", "HTTP_UPGRADE": "websocket"}, "websocket", id="websocket"),
        pytest.param({"HTTP_CONNECTION": "keep-alive, upgrade", "HTTP_UPGRADE": "SPDY/3.1"}, "SPDY/3.1",
                     id="spdy-among-tokens"),
        pytest.param({"HTTP_CONNECTION": "UPGRADE", "HTTP_UPGRADE": " WebSocket "}, "WebSocket", id="any-case"),
        pytest.param({"HTTP_UPGRADE": "websocket"}, None, id="upgrade-without-connection"),
        pytest.param({"HTTP_CONNECTION": "Upgrade", "HTTP_UPGRADE": "foo"}, None, id="unknown-protocol"),
        pytest.param({"HTTP_CONNECTION": "Upgrade, HTTP2-Settings", "HTTP_UPGRADE": "h2c"}, None, id="h2c"),
        pytest.param({"HTTP_CONNECTION": "keep-alive", "HTTP_UPGRADE": "websocket"}, None,
                     id="connection-without-upgrade"),
        pytest.param({"HTTP_CONNECTION": "upgraded", "HTTP_UPGRADE": "websocket"}, None, id="not-the-token"),
        pytest.param({}, None, id="plain"),
    ],
)
def test_only_a_connection_upgrade_to_a_spliced_protocol_is_an_upgrade(headers: dict[str, str],
                                                                        expected: str | None) -> None:
    environ: dict[str, Any] = {"REQUEST_METHOD": "POST", **headers}
    assert upgrade_protocol(environ) == expected
    # Decided once: later layers read the same answer even if a header changed meanwhile.
    environ["HTTP_CONNECTION"], environ["HTTP_UPGRADE"] = "Upgrade", "websocket"
    assert upgrade_protocol(environ) == expected
    assert environ[UPGRADE] == (expected or "")
