"""What every management endpoint receives: the request, the caller, the store, the settings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from ...clusters.permissions import ClusterAccess, ClusterCreators, DriverDirectory
from ...core import environ as env
from ...core.bodies import parse_json, read_bounded
from ...core.errors import BadRequest, Forbidden, Unauthorized
from ...core.quotas import Quotas
from ...core.records import ClusterRecord
from .store import ManagementStore

if TYPE_CHECKING:
    from ...outbound.addresses import AddressPolicy
    from ...recording.catalog import SessionReader


@dataclass(frozen=True)
class APISettings:
    """:param gateway_ca_pem: the CA that signed the gateway's certificate (handed to clients).
    :param public_url: the gateway's external base URL, when clients must not use ``Host``.
    :param gateway_cert_pem: the gateway's own certificate, to check a ``Host`` against its names.
    :param max_body: the largest request body accepted, in bytes.
    :param address_policy: refuses reported apiserver addresses that are IP addresses the
        upstream address policy refuses (connecting checks again, names included).
    :param quotas: what a user may create (:mod:`bcs_middleware.core.quotas`).
    :param cluster_creators: who may register clusters.
    """

    gateway_ca_pem: str | None = None
    public_url: str | None = None
    gateway_cert_pem: bytes | None = None
    max_body: int = 1024 * 1024
    address_policy: AddressPolicy | None = None
    quotas: Quotas = field(default_factory=Quotas)
    cluster_creators: ClusterCreators = field(default_factory=ClusterCreators)


@dataclass
class Ctx:
    request: Request
    store: ManagementStore
    settings: APISettings
    access: ClusterAccess
    #: where mesos-drivers are found: the ids they serve are registered by superusers only
    drivers: DriverDirectory | None = None
    #: where recorded exec/attach sessions live (``None``: not configured)
    recordings: SessionReader | None = None

    @property
    def environ(self) -> dict[str, Any]:
        return self.request.environ

    @property
    def user(self) -> env.User | None:
        return env.get_user(self.environ)

    @property
    def actor(self) -> str:
        if self.user is not None:
            return self.user.name
        agent = env.get_agent(self.environ)
        return f"cluster-agent:{agent.cluster_id}" if agent else "anonymous"

    def require_user(self) -> env.User:
        user = self.user
        if user is None:
            if env.get_agent(self.environ) is not None:
                raise Forbidden("a register token may only report its own cluster's credentials")
            raise Unauthorized("missing bearer token")
        return user

    def require_superuser(self) -> env.User:
        user = self.require_user()
        if not user.is_superuser:
            raise Forbidden(f"user {user.name!r} is not a superuser")
        return user

    def require_cluster(self, cluster_id: str, needed: str) -> tuple[env.User, ClusterRecord]:
        """The caller and the cluster, if the caller holds ``needed`` on it (404 when it may not see it)."""
        user = self.require_user()
        return user, self.access.require(user, cluster_id, needed)

    def body(self, *, allow_empty: bool = False) -> Any:
        """The JSON body, read with a hard bound whether sized or chunked."""
        raw = read_bounded(self.environ, self.settings.max_body)
        if not raw.strip():
            if allow_empty:
                return {}
            raise BadRequest("request body is empty; expected a JSON object", code_name="INVALID_JSON")
        return parse_json(raw)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = Response(json.dumps(data), status=status, mimetype="application/json", headers=headers)
    response.headers["Cache-Control"] = "no-store"
    return response
