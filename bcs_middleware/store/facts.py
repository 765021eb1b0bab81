"""What the instances sharing this database agree on, and the re-encryption of every stored secret.

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from . import models as m
from .rows import Repository, utcnow

#: The instance fact encrypted with the secret key (re-encrypted by :meth:`FactRepository.rotate_secrets`).
SECRET_CHECK_FACT = "secret_key_check"
#: The instance fact naming the key every stored secret is encrypted with (:meth:`SecretBox.key_id`).
SECRET_KEY_ID_FACT = "secret_key_id"


class FactRepository(Repository):
    """What the instances sharing this database agree on, and the re-encryption of every stored secret."""

    def get_fact(self, name: str) -> str | None:
        with self.db.connection() as conn:
            value = conn.execute(select(m.instance_facts.c.value).where(m.instance_facts.c.name == name)).scalar()
        return str(value) if value is not None else None

    def put_fact(self, name: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` as ``name`` unless a value is recorded already (``replace``: overwrite it);
        returns the value recorded now — another instance's, when it was first."""
        table = m.instance_facts
        with self.db.transaction() as conn:
            if replace and conn.execute(
                update(table).where(table.c.name == name).values(value=value, updated_at=utcnow())
            ).rowcount:
                return value
            try:
                with conn.begin_nested():
                    conn.execute(insert(table).values(name=name, value=value, updated_at=utcnow()))
                return value
            except IntegrityError:
                pass  # recorded meanwhile by another instance: theirs stands
            return str(conn.execute(select(table.c.value).where(table.c.name == name)).scalar_one())

    def sample_secrets(self) -> list[str]:
        """The newest encrypted register token and cluster credential, as stored (for a key check)."""
        with self.db.connection() as conn:
            token = conn.execute(select(m.register_tokens.c.token_encrypted)
                                 .order_by(m.register_tokens.c.id.desc()).limit(1)).scalar()
            credential = conn.execute(select(m.cluster_credentials.c.secret_encrypted)
                                      .order_by(m.cluster_credentials.c.updated_at.desc()).limit(1)).scalar()
        return [str(value) for value in (token, credential) if value is not None]

    def rotate_secrets(self) -> int:
        """Re-encrypt every stored secret with the current (first) key, in one transaction; how
        many. Records that key's id (:data:`SECRET_KEY_ID_FACT`) with them.

        :raises ConfigError: a stored secret that none of the keys decrypts (nothing changes).
        """
        count = 0
        with self.db.transaction() as conn:
            for row in conn.execute(select(m.register_tokens.c.id, m.register_tokens.c.token_encrypted)).all():
                conn.execute(
                    update(m.register_tokens)
                    .where(m.register_tokens.c.id == row.id)
                    .values(token_encrypted=self.db.secrets.rotate(row.token_encrypted))
                )
                count += 1
            rows = conn.execute(
                select(m.cluster_credentials.c.cluster_id, m.cluster_credentials.c.secret_encrypted)
            ).all()
            for row in rows:
                conn.execute(
                    update(m.cluster_credentials)
                    .where(m.cluster_credentials.c.cluster_id == row.cluster_id)
                    .values(secret_encrypted=self.db.secrets.rotate(row.secret_encrypted))
                )
                count += 1
            check = conn.execute(select(m.instance_facts.c.value)
                                 .where(m.instance_facts.c.name == SECRET_CHECK_FACT)).scalar()
            if check is not None:
                conn.execute(update(m.instance_facts).where(m.instance_facts.c.name == SECRET_CHECK_FACT)
                             .values(value=self.db.secrets.rotate(check), updated_at=utcnow()))
            key_id = self.db.secrets.key_id()
            if not conn.execute(update(m.instance_facts).where(m.instance_facts.c.name == SECRET_KEY_ID_FACT)
                                .values(value=key_id, updated_at=utcnow())).rowcount:
                conn.execute(insert(m.instance_facts).values(name=SECRET_KEY_ID_FACT, value=key_id,
                                                             updated_at=utcnow()))
        return count
