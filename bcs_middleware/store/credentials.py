"""What a cluster's kube-agent reported: apiserver addresses, CA and service-account token (encrypted at rest).

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

import json

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from ..core.records import CredentialRecord
from . import models as m
from .rows import Repository, aware, get_cluster, utcnow


class CredentialRepository(Repository):
    """What a cluster's kube-agent reported: apiserver addresses, CA and service-account token (encrypted at rest)."""

    def put_credentials(
        self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str
    ) -> CredentialRecord:
        return self.report_credentials(
            cluster_id, server_addresses=server_addresses, cacert_pem=cacert_pem, user_token=user_token
        )[1]

    def report_credentials(
        self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str,
        via_tunnel: bool = False,
    ) -> tuple[tuple[str, ...] | None, CredentialRecord]:
        """Store a kube-agent's report; also the addresses it replaced (``None``: first report).

        :param via_tunnel: the report came with the agent's tunnel: the apiserver is
            reached through that connection, not directly.
        """
        get_cluster(self.db, cluster_id)
        blob = self.db.secrets.encrypt(
            json.dumps(
                {"server_addresses": server_addresses, "cacert_pem": cacert_pem, "user_token": user_token}
            )
        )
        now = utcnow()
        previous: tuple[str, ...] | None = None
        with self.db.transaction() as conn:
            old = conn.execute(
                select(m.cluster_credentials.c.secret_encrypted).where(
                    m.cluster_credentials.c.cluster_id == cluster_id
                )
            ).first()
            if old is not None:
                previous = tuple(json.loads(self.db.secrets.decrypt(old.secret_encrypted))["server_addresses"])
            changed = conn.execute(
                update(m.cluster_credentials)
                .where(m.cluster_credentials.c.cluster_id == cluster_id)
                .values(secret_encrypted=blob, updated_at=now, via_tunnel=via_tunnel)
            ).rowcount
            if not changed:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(m.cluster_credentials).values(
                                cluster_id=cluster_id, secret_encrypted=blob, updated_at=now,
                                via_tunnel=via_tunnel,
                            )
                        )
                except IntegrityError:
                    # Another reporter inserted first: last writer wins, like the update.
                    conn.execute(
                        update(m.cluster_credentials)
                        .where(m.cluster_credentials.c.cluster_id == cluster_id)
                        .values(secret_encrypted=blob, updated_at=now, via_tunnel=via_tunnel)
                    )
        return previous, CredentialRecord(cluster_id, tuple(server_addresses), cacert_pem, user_token, now,
                                          via_tunnel)

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None:
        with self.db.connection() as conn:
            row = conn.execute(
                select(m.cluster_credentials).where(m.cluster_credentials.c.cluster_id == cluster_id)
            ).first()
        if row is None:
            return None
        data = json.loads(self.db.secrets.decrypt(row.secret_encrypted))
        return CredentialRecord(
            cluster_id,
            tuple(data["server_addresses"]),
            data["cacert_pem"],
            data["user_token"],
            aware(row.updated_at),
            bool(row.via_tunnel),
        )
