"""A gateway has one outbound transport, shared by every layer that calls out.

The proxy (tunnel and Mesos drivers), the webhook client, the admission layer's cluster
reads and the RBAC source and sync must all hold the very instance the gateway was built
with: one pool, one address policy, one error translation.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.admission.client import WebhookClient
from bcs_middleware.compose import resources as resources_module
from bcs_middleware.compose.config import AdmissionSettings, GatewayConfig, OutboundSettings, RBACSettings
from bcs_middleware.compose.gateway import build_gateway
from bcs_middleware.outbound.addresses import AddressPolicy
from bcs_middleware.outbound.transport import PooledTransport
from bcs_middleware.rbac.service import RBACService, build_service
from bcs_middleware.rbac.sources import HTTPSource
from bcs_middleware.store.sql import open_store


def _module_namespace(obj: Any) -> bool:
    """A module's globals (reached through a function's ``__globals__``): what lives there, such as
    ``default_transport()``'s process-wide instance made by an earlier test, is not the app's."""
    return isinstance(obj, dict) and "__builtins__" in obj and "__name__" in obj


def _reachable(root: Any, kind: type, limit: int = 200_000) -> list[Any]:
    """Every ``kind`` instance reachable from ``root`` through the package's own objects."""
    found: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kind):
            found[id(obj)] = obj
            continue
        module = type(obj).__module__ or ""
        if module.startswith("bcs_middleware") or isinstance(obj, (dict, list, tuple, set)) or callable(obj):
            if isinstance(obj, type) or type(obj).__name__ == "module" or _module_namespace(obj):
                continue
            stack.extend(gc.get_referents(obj))
    return list(found.values())


def test_every_layer_of_a_gateway_shares_its_one_transport(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    services: list[RBACService] = []

    def capturing(*args: Any, **kwargs: Any) -> RBACService:
        services.append(build_service(*args, **kwargs))
        return services[-1]

    monkeypatch.setattr(resources_module, "build_service", capturing)
    store = open_store("sqlite://", secret_key=Fernet.generate_key().decode())
    (tmp_path / "token").write_text("t")
    config = GatewayConfig(admission=AdmissionSettings(enabled=True),
                           rbac=RBACSettings(enabled=True, source_url="https://auth.example/rbac",
                                             source_token_file=str(tmp_path / "token")),
                           outbound=OutboundSettings(deny=("10.0.0.0/8",)))
    app = build_gateway(config, store=store, background=False)
    transports = _reachable(app, PooledTransport)
    assert len(transports) == 1, transports
    (transport,) = transports
    assert isinstance(transport.address_policy, AddressPolicy)
    assert [str(n) for n in transport.address_policy.deny] == ["10.0.0.0/8"]
    clients = _reachable(app, WebhookClient)
    assert clients and all(client.transport is transport for client in clients)
    # The RBAC service (kept by its own thread, not by the app): its clusters and its source.
    (service,) = services
    assert service.transport is transport
    assert isinstance(service.source, HTTPSource) and service.source._transport is transport
