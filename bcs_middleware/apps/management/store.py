"""What the management API needs from the store: :class:`ManagementStore` (``SQLStore`` has it).

Declared here, beside its consumer, so the API depends on these calls only and a test
can hand it any object that has them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ...clusters.permissions import PermissionStore
from ...core.records import (
    ClusterRecord,
    CredentialRecord,
    GroupPermissionRecord,
    PermissionRecord,
    PlacementRecord,
    TokenRecord,
    UserRecord,
)


class ManagementStore(PermissionStore, Protocol):
    """Users, tokens, clusters, register tokens, credentials, permissions and the audit trail,
    as the endpoints (:mod:`.endpoints`, :mod:`.inventory`) call them; plus what the default
    :class:`~bcs_middleware.clusters.permissions.ClusterAuthorizer` reads."""

    # users and tokens
    def create_user(self, name: str, *, is_superuser: bool = False) -> UserRecord: ...

    def find_user(self, name: str) -> UserRecord | None: ...

    def list_users(self) -> list[UserRecord]: ...

    def set_superuser(self, name: str, is_superuser: bool) -> tuple[UserRecord, bool]: ...

    def delete_user(self, name: str) -> tuple[UserRecord, list[tuple[str, str]], int]: ...

    def create_token(self, user_id: int, *, token_type: str = "user", expires_at: datetime | None = None,
                     limit: int | None = None) -> tuple[TokenRecord, str]: ...

    def list_tokens(self, user_id: int) -> list[TokenRecord]: ...

    def revoke_token(self, user_id: int, token_id: int) -> TokenRecord: ...

    # clusters and their register tokens
    def create_cluster(self, cluster_id: str, *, project_id: str, cluster_type: str, creator_id: int | None = None,
                       limit: int | None = None) -> ClusterRecord: ...

    def get_cluster(self, cluster_id: str) -> ClusterRecord: ...

    def delete_cluster(self, cluster_id: str) -> dict[str, Any]: ...

    def create_register_token(self, cluster_id: str) -> str: ...

    def get_register_token(self, cluster_id: str) -> tuple[str, datetime]: ...

    def revoke_register_token(self, cluster_id: str) -> datetime: ...

    def authenticate_register_token(self, token: str) -> str | None: ...

    def check_register_token(self, cluster_id: str, token: str) -> bool | None: ...

    # credentials and where an agent is held
    def report_credentials(self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str,
                           via_tunnel: bool = False) -> tuple[tuple[str, ...] | None, CredentialRecord]: ...

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None: ...

    def get_placement(self, cluster_id: str) -> PlacementRecord | None: ...

    # permissions and the audit trail
    def list_cluster_permissions(self, cluster_id: str, user_id: int | None = None) -> list[PermissionRecord]: ...

    def set_cluster_permission(self, cluster_id: str, user_id: int, permission: str | None, *,
                               keep_an_editor: bool = True, limit: int | None = None) -> str | None: ...

    def list_group_permissions(self, cluster_id: str, group: str | None = None) -> list[GroupPermissionRecord]: ...

    def set_group_permission(self, cluster_id: str, group: str, permission: str | None, *,
                             limit: int | None = None) -> str | None: ...

    def record_audit(self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None) -> None: ...
