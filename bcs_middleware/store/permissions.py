"""Per-cluster permissions of users, and the grants of the RBAC subscription.

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement

from ..core.errors import Conflict, NotFound
from ..core.quotas import QuotaExceeded
from ..core.records import GroupPermissionRecord, PermissionRecord
from . import models as m
from .rows import Repository, aware, utcnow


class PermissionRepository(Repository):
    """Per-cluster permissions of users, and the grants of the RBAC subscription."""

    def cluster_permission(self, cluster_id: str, user_id: int) -> str | None:
        """``"view"``, ``"edit"`` or ``None``: what the permission table says (superusers aside)."""
        with self.db.connection() as conn:
            value = conn.execute(
                select(m.cluster_permissions.c.permission).where(
                    m.cluster_permissions.c.cluster_id == cluster_id, m.cluster_permissions.c.user_id == user_id
                )
            ).scalar()
        return str(value) if value is not None else None

    def list_cluster_permissions(self, cluster_id: str, user_id: int | None = None) -> list[PermissionRecord]:
        query = (
            select(m.cluster_permissions, m.users.c.name)
            .join(m.users, m.users.c.id == m.cluster_permissions.c.user_id)
            .where(m.cluster_permissions.c.cluster_id == cluster_id)
            .order_by(m.users.c.name)
        )
        if user_id is not None:
            query = query.where(m.cluster_permissions.c.user_id == user_id)
        with self.db.connection() as conn:
            rows = conn.execute(query).all()
        return [
            PermissionRecord(r.cluster_id, r.user_id, r.name, r.permission, aware(r.updated_at))  # type: ignore[arg-type]
            for r in rows
        ]

    def user_cluster_permissions(self, user_id: int) -> dict[str, str]:
        """Every cluster the permission table gives ``user_id`` something on: ``{cluster_id: permission}``."""
        table = m.cluster_permissions
        with self.db.connection() as conn:
            rows = conn.execute(select(table.c.cluster_id, table.c.permission).where(table.c.user_id == user_id))
            return {str(r.cluster_id): str(r.permission) for r in rows}

    def set_cluster_permission(
        self, cluster_id: str, user_id: int, permission: str | None, *, keep_an_editor: bool = True,
        limit: int | None = None,
    ) -> str | None:
        """Give ``user_id`` ``permission`` on the cluster (``None`` removes it); the previous one.

        With ``keep_an_editor`` a change that would leave the cluster without any
        ``edit`` holder is refused (409 ``LAST_EDIT_HOLDER``); the check and the
        change are one transaction, so two holders removing each other cannot both win.
        ``limit`` is the ``permissions_per_cluster`` quota: a grant to one more user past it
        is refused (:class:`QuotaExceeded`); changing or removing a grant never is.
        """
        table = m.cluster_permissions
        with self.db.transaction() as conn:
            # The cluster's row lock serialises every change of its permissions: rows inserted
            # by another process meanwhile are counted, not only the rows that existed.
            if conn.execute(
                select(m.clusters.c.id).where(m.clusters.c.id == cluster_id).with_for_update()
            ).first() is None:
                raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
            editors = {
                row.user_id: row.permission
                for row in conn.execute(
                    select(table.c.user_id, table.c.permission)
                    .where(table.c.cluster_id == cluster_id)
                    .with_for_update()
                )
            }
            previous = editors.get(user_id)
            if previous is None and permission is not None and limit is not None and len(editors) >= limit:
                raise QuotaExceeded("permissions_per_cluster", limit, f"cluster {cluster_id!r}", len(editors))
            if (
                keep_an_editor
                and previous == "edit"
                and permission != "edit"
                and not any(uid != user_id and p == "edit" for uid, p in editors.items())
            ):
                raise Conflict(
                    f"this would leave cluster {cluster_id!r} without an edit holder: grant edit to another "
                    "user first (a superuser may do it; the cluster is then managed by superusers only)",
                    code_name="LAST_EDIT_HOLDER",
                )
            where = (table.c.cluster_id == cluster_id, table.c.user_id == user_id)
            if permission is None:
                conn.execute(delete(table).where(*where))
            elif previous is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(table).values(cluster_id=cluster_id, user_id=user_id, permission=permission,
                                                 updated_at=utcnow())
                        )
                except IntegrityError:
                    # A concurrent grant to the same user inserted first: last writer wins.
                    conn.execute(update(table).where(*where).values(permission=permission, updated_at=utcnow()))
            else:
                conn.execute(update(table).where(*where).values(permission=permission, updated_at=utcnow()))
        return previous

    def group_cluster_permission(self, cluster_id: str, groups: tuple[str, ...]) -> str | None:
        """The strongest permission any of ``groups`` holds on the cluster."""
        if not groups:
            return None
        table = m.cluster_group_permissions
        with self.db.connection() as conn:
            found = {str(p) for p in conn.execute(select(table.c.permission).where(
                table.c.cluster_id == cluster_id, table.c.group_name.in_(groups))).scalars()}
        return "edit" if "edit" in found else "view" if "view" in found else None

    def groups_cluster_permissions(self, groups: tuple[str, ...]) -> dict[str, str]:
        """Every cluster one of ``groups`` holds something on: ``{cluster_id: strongest permission}``."""
        if not groups:
            return {}
        table = m.cluster_group_permissions
        held: dict[str, str] = {}
        with self.db.connection() as conn:
            for row in conn.execute(select(table.c.cluster_id, table.c.permission).where(
                    table.c.group_name.in_(groups))):
                if held.get(str(row.cluster_id)) != "edit":
                    held[str(row.cluster_id)] = str(row.permission)
        return held

    def list_group_permissions(self, cluster_id: str, group: str | None = None) -> list[GroupPermissionRecord]:
        table = m.cluster_group_permissions
        query = select(table).where(table.c.cluster_id == cluster_id).order_by(table.c.group_name)
        if group is not None:
            query = query.where(table.c.group_name == group)
        with self.db.connection() as conn:
            rows = conn.execute(query).all()
        return [GroupPermissionRecord(r.cluster_id, r.group_name, r.permission, aware(r.updated_at))  # type: ignore[arg-type]
                for r in rows]

    def set_group_permission(self, cluster_id: str, group: str, permission: str | None, *,
                             limit: int | None = None) -> str | None:
        """Give ``group`` ``permission`` on the cluster (``None`` removes it); the previous one.

        ``limit`` bounds the groups holding something on one cluster (the
        ``permissions_per_cluster`` quota, counted apart from users' grants).
        """
        table = m.cluster_group_permissions
        with self.db.transaction() as conn:
            if conn.execute(
                select(m.clusters.c.id).where(m.clusters.c.id == cluster_id).with_for_update()
            ).first() is None:
                raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
            held = {str(r.group_name): str(r.permission) for r in conn.execute(
                select(table.c.group_name, table.c.permission).where(table.c.cluster_id == cluster_id))}
            previous = held.get(group)
            if previous is None and permission is not None and limit is not None and len(held) >= limit:
                raise QuotaExceeded("permissions_per_cluster", limit, f"cluster {cluster_id!r}", len(held))
            where = (table.c.cluster_id == cluster_id, table.c.group_name == group)
            if permission is None:
                conn.execute(delete(table).where(*where))
            elif previous is None:
                conn.execute(insert(table).values(cluster_id=cluster_id, group_name=group, permission=permission,
                                                  updated_at=utcnow()))
            else:
                conn.execute(update(table).where(*where).values(permission=permission, updated_at=utcnow()))
        return previous

    def replace_rbac_grants(self, entries: set[tuple[str, str, str]]) -> None:
        """Make the table hold exactly ``(subject_kind, subject, cluster)`` ``entries``."""
        table = m.rbac_cluster_grants
        with self.db.transaction() as conn:
            conn.execute(delete(table))
            if entries:
                conn.execute(
                    insert(table),
                    [{"subject_kind": k, "subject": s, "cluster": c} for k, s, c in sorted(entries)],
                )

    def rbac_grants_cluster(self, user_name: str, groups: tuple[str, ...], cluster_id: str) -> bool:
        """Whether the subscription grants the user (or one of ``groups``) anything on the cluster."""
        table = m.rbac_cluster_grants
        subject: ColumnElement[bool] = (table.c.subject_kind == "User") & (table.c.subject == user_name)
        if groups:
            subject = or_(subject, (table.c.subject_kind == "Group") & table.c.subject.in_(groups))
        with self.db.connection() as conn:
            row = conn.execute(
                select(table.c.cluster).where(subject, table.c.cluster.in_((cluster_id, "*"))).limit(1)
            ).first()
        return row is not None

    def rbac_granted_clusters(self, user_name: str, groups: tuple[str, ...]) -> set[str]:
        """The clusters the subscription grants the user (or one of ``groups``) anything on; ``"*"`` = all."""
        table = m.rbac_cluster_grants
        subject: ColumnElement[bool] = (table.c.subject_kind == "User") & (table.c.subject == user_name)
        if groups:
            subject = or_(subject, (table.c.subject_kind == "Group") & table.c.subject.in_(groups))
        with self.db.connection() as conn:
            return {str(r.cluster) for r in conn.execute(select(table.c.cluster).where(subject).distinct())}
