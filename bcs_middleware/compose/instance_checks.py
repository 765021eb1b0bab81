"""What gateway instances sharing one database must agree on, checked when each one starts.

Gateways on several machines, or several servers on one, share a database. Some
things must then be the same in every instance, and a difference is silent until a
client trips over it:

* **the secret key**: register tokens and cluster credentials are encrypted with it.
  An instance with another key starts, and every request that needs a stored
  secret then fails. The first instance stores a value encrypted with its key
  (``instance_facts.secret_key_check``); an instance whose keys cannot decrypt it —
  or cannot decrypt the newest stored secret — refuses to start. An instance whose
  first (current) key is not the one the stored secrets are encrypted with
  (``secret_key_id``) re-encrypts them all with it at start, in one transaction:
  that is the rotation (``BCS_SECRET_KEY=NEW,OLD``, then ``NEW`` alone), and, on the
  first start after an upgrade, a check of every stored secret.
* **the CA handed to clients** (``client_credentials``' ``cacert_data``, kubeconfigs):
  clients that got one instance's CA cannot verify another instance's certificate.
  The first instance records the CA certificate(s) it hands out
  (``instance_facts.gateway_ca``); an instance handing out another refuses to start.
  A deliberate change of CA is recorded with ``bcs-middleware set-shared-ca``.
* **the bootstrap users' tokens**: see :func:`bcs_middleware.compose.bootstrap.apply_bootstrap`
  (an instance never replaces the token another instance's operator holds).

Every check raises :class:`~bcs_middleware.core.errors.ConfigError` with the fix in its
message; nothing here reveals a key or a token.
"""

from __future__ import annotations

import logging
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ..core.errors import ConfigError
from ..pki.certificates import cert_fingerprint
from ..store.database import Database
from ..store.facts import SECRET_CHECK_FACT, SECRET_KEY_ID_FACT

log = logging.getLogger(__name__)

#: The CA certificate(s) the gateways hand to clients, PEM.
CA_FACT = "gateway_ca"
_CHECK_TEXT = "bcs-middleware secret key check"


class FactStore(Protocol):
    """What the checks need of the store (:class:`~bcs_middleware.store.sql.SQLStore`)."""

    @property
    def db(self) -> Database: ...

    def get_fact(self, name: str) -> str | None: ...

    def put_fact(self, name: str, value: str, *, replace: bool = False) -> str: ...

    def sample_secrets(self) -> list[str]: ...

    def rotate_secrets(self) -> int: ...


def check_secret_key(store: FactStore) -> None:
    """Refuse a secret key that cannot decrypt what the database holds; record the check
    value when this is the first instance with a key."""
    box = store.db.secrets
    if box.locked:
        return  # nothing to decrypt with: the callers that need a key say so themselves
    recorded = store.get_fact(SECRET_CHECK_FACT)
    undecryptable = [value for value in store.sample_secrets() if not box.can_decrypt(value)]
    if recorded is None and not undecryptable:
        recorded = store.put_fact(SECRET_CHECK_FACT, box.encrypt(_CHECK_TEXT))
    if undecryptable or (recorded is not None and not box.can_decrypt(recorded)):
        raise _wrong_key(store)
    if store.get_fact(SECRET_KEY_ID_FACT) != box.key_id():
        try:
            count = store.rotate_secrets()
        except ConfigError:
            raise _wrong_key(store) from None
        log.info("re-encrypted %d stored secret(s) with the current secret key", count)


def _wrong_key(store: FactStore) -> ConfigError:
    box = store.db.secrets
    return ConfigError(
        f"the secret key ({box.origin}) cannot decrypt the secrets stored in the database "
        f"{store.db.display_url}: every gateway instance sharing a database must use the same key. "
        "Give this instance the key of the instances already using it (their BCS_SECRET_KEY or "
        "secret_key, or their DATA_DIR/secret.key); to rotate a key, list the new one first and "
        "keep the old one: BCS_SECRET_KEY=NEW,OLD"
    )


def _fingerprints(pem: str) -> list[str]:
    try:
        certificates = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        raise ConfigError("the gateway CA file holds no PEM certificate") from None
    return [cert_fingerprint(cert.public_bytes(Encoding.DER)) for cert in certificates]


def _describe(pem: str) -> str:
    """The first certificate's subject and SHA-256, for messages."""
    cert = x509.load_pem_x509_certificates(pem.encode())[0]
    return f"{cert.subject.rfc4514_string()}, SHA-256 {cert_fingerprint(cert.public_bytes(Encoding.DER))}"


def check_gateway_ca(store: FactStore, ca_pem: str | None, *, source: str) -> None:
    """Refuse to hand clients another CA than the one the shared database records; record
    ``ca_pem`` when none is recorded yet.

    :param ca_pem: the CA certificate(s) this instance hands out (``None``: none).
    :param source: where it came from (a file name), for messages.
    """
    if ca_pem is None:
        recorded = store.get_fact(CA_FACT)
        if recorded is not None:
            log.warning("this instance hands clients no CA, while the instances sharing its database hand "
                        "out %s", _describe(recorded))
        return
    mine = _fingerprints(ca_pem)
    recorded = store.put_fact(CA_FACT, ca_pem)
    if sorted(_fingerprints(recorded)) != sorted(mine):
        raise ConfigError(
            f"this instance's CA ({source}: {_describe(ca_pem)}) is not the CA the gateways sharing the "
            f"database {store.db.display_url} hand to clients ({_describe(recorded)}): clients given one could "
            "not verify the other. Give this instance the shared CA (copy ca.crt and ca.key into its "
            "DATA_DIR/tls/, or serve --certfile/--keyfile signed by it with --ca-file), or record a new "
            "CA for every instance: bcs-middleware set-shared-ca"
        )


def recorded_ca(store: FactStore) -> str | None:
    """The CA the database records for the gateways, described (``None``: none yet)."""
    recorded = store.get_fact(CA_FACT)
    return _describe(recorded) if recorded is not None else None


def record_gateway_ca(store: FactStore, ca_pem: str) -> tuple[str | None, str]:
    """Record ``ca_pem`` as the CA every instance hands out (an operator's deliberate change);
    the description of the CA recorded before (``None``: none) and of the new one."""
    _fingerprints(ca_pem)
    before = store.get_fact(CA_FACT)
    store.put_fact(CA_FACT, ca_pem, replace=True)
    return (_describe(before) if before is not None else None), _describe(ca_pem)
