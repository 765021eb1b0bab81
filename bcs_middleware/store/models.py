"""Table definitions (SQLAlchemy Core). Changes here need an Alembic migration beside them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("is_superuser", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

user_tokens = Table(
    "user_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("token_type", String(32), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

clusters = Table(
    "clusters",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("project_id", String(128), nullable=False),
    Column("cluster_type", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Who registered it (a users.id): what the clusters_per_user quota counts
    # (bcs_middleware.core.quotas). Kept when edit passes to others, so nobody can hand their
    # clusters to another user's quota; cleared by the store when that user is deleted.
    # No foreign key: adding one to this table makes SQLite rebuild it, and dropping the
    # old table would cascade to every table referencing clusters.
    Column("created_by", Integer, nullable=True, index=True),
)

register_tokens = Table(
    "register_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "cluster_id",
        String(128),
        ForeignKey("clusters.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    ),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("token_encrypted", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

cluster_credentials = Table(
    "cluster_credentials",
    metadata,
    Column(
        "cluster_id",
        String(128),
        ForeignKey("clusters.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    # JSON {server_addresses, cacert_pem, user_token}, Fernet-encrypted as a whole.
    Column("secret_encrypted", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # Reported through the kube-agent's tunnel: the apiserver is reached through it.
    Column("via_tunnel", Boolean, nullable=False, default=False, server_default=false()),
)

# Which gateway process holds each cluster's agent tunnel right now (one row per
# cluster: the newest connection wins). ``seen_at`` is the holder's heartbeat.
agent_placements = Table(
    "agent_placements",
    metadata,
    Column("cluster_id", String(128), ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
    Column("holder_id", String(160), nullable=False, index=True),
    Column("peer_address", String(300), nullable=True),
    Column("peer_fingerprint", String(128), nullable=True),
    Column("connected_at", DateTime(timezone=True), nullable=False),
    Column("seen_at", DateTime(timezone=True), nullable=False),
)

webhook_definitions = Table(
    "webhook_definitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # "bcs" for the mesos-driver definition, "k8s" for admissionregistration ones.
    Column("flavor", String(8), nullable=False),
    # Empty for bcs definitions (gateway-wide); the cluster id for Kubernetes ones.
    Column("cluster_id", String(128), nullable=False, default=""),
    Column("kind", String(64), nullable=False),
    Column("name", String(253), nullable=False),
    # bcs: "Create/application" — unique per (operation, kind) as the source requires.
    Column("match_key", String(128), nullable=False),
    Column("document", JSON, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("flavor", "cluster_id", "kind", "name", name="uq_webhook_definitions_name"),
    UniqueConstraint("flavor", "cluster_id", "match_key", name="uq_webhook_definitions_match"),
)

# The source system's user_cluster_permissions: what a gateway user may do with a
# cluster ("view" to use it, "edit" to manage it); one row per (cluster, user).
cluster_permissions = Table(
    "cluster_permissions",
    metadata,
    Column("cluster_id", String(128), ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True),
    Column("permission", String(8), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Cluster permissions held by a group (an identity provider's group, or a tokens file's):
# every member has them. One row per (cluster, group); the name is the group as the user's
# authenticator maps it (prefix included).
cluster_group_permissions = Table(
    "cluster_group_permissions",
    metadata,
    Column("cluster_id", String(128), ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
    Column("group_name", String(253), primary_key=True, index=True),
    Column("permission", String(8), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Which clusters the RBAC subscription grants each subject something on (the leader
# writes it from the grants it loaded), so every process can answer "may this user
# see this cluster" without loading the subscription itself. cluster "*" = all.
rbac_cluster_grants = Table(
    "rbac_cluster_grants",
    metadata,
    Column("subject_kind", String(8), primary_key=True),
    Column("subject", String(253), primary_key=True),
    Column("cluster", String(128), primary_key=True),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False, index=True),
    Column("actor", String(128), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(512), nullable=False),
    Column("detail", JSON, nullable=False),
)

# What every gateway instance sharing this database must agree on, one row per fact
# (bcs_middleware.compose.instance_checks): written by the first instance, checked by the others.
instance_facts = Table(
    "instance_facts",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# A monotonically increasing counter per topic ("webhooks"), bumped on every change,
# so each process can tell cheaply whether its cached copy is stale.
revisions = Table(
    "revisions",
    metadata,
    Column("topic", String(64), primary_key=True),
    Column("revision", Integer, nullable=False),
)


# Recorded exec/attach sessions (issue 28) when recording_store = database: the description
# of each, and its asciicast text in chunks appended as the session runs, so every instance
# sharing the database lists and serves every recording (bcs_middleware.store.recordings).
session_recordings = Table(
    "session_recordings",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("cluster_id", String(128), nullable=False, index=True),
    Column("user_name", String(128), nullable=False, index=True),
    Column("started_at", DateTime(timezone=True), nullable=False, index=True),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("status", String(16), nullable=False, index=True),
    Column("size", BigInteger, nullable=False),
    Column("info", JSON, nullable=False),
    # The writer's last sign of life while the session runs (an instance ends a session whose
    # writer died: bcs_middleware.recording.recorder).
    Column("heartbeat_at", DateTime(timezone=True), nullable=True),
)

session_recording_chunks = Table(
    "session_recording_chunks",
    metadata,
    Column("recording_id", String(32), ForeignKey("session_recordings.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)
