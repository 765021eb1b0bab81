"""What instances sharing a database agree on: facts, the secret-key check, bootstrap token claims."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trustme
from cryptography.fernet import Fernet

from bcs_middleware.compose.instance_checks import check_gateway_ca, check_secret_key, record_gateway_ca, recorded_ca
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.store.crypto import SecretBox, token_digest
from bcs_middleware.store.database import Database
from bcs_middleware.store.facts import SECRET_CHECK_FACT, SECRET_KEY_ID_FACT
from bcs_middleware.store.sql import SQLStore


def _key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def keys() -> tuple[str, str]:
    return _key(), _key()


_opened: list[SQLStore] = []


@pytest.fixture
def store(database_url: str, keys: tuple[str, str]) -> Iterator[SQLStore]:
    store = SQLStore(Database(database_url, secrets=SecretBox([keys[0]])))
    store.db.migrate()
    yield store
    for other in [store, *_opened]:
        other.db.dispose()
    _opened.clear()


def _with_keys(store: SQLStore, *keys: str) -> SQLStore:
    """The same database as another instance with ``keys`` sees it."""
    other = SQLStore(Database(store.db.url, secrets=SecretBox(list(keys), origin="test keys")))
    _opened.append(other)
    return other


def test_a_fact_is_recorded_once_and_the_first_value_stands(store: SQLStore) -> None:
    assert store.get_fact("x") is None
    assert store.put_fact("x", "first") == "first"
    assert store.put_fact("x", "second") == "first"
    assert store.get_fact("x") == "first"
    assert store.put_fact("x", "third", replace=True) == "third"
    assert store.get_fact("x") == "third"


def test_the_first_key_is_recorded_and_another_key_is_refused(store: SQLStore, keys: tuple[str, str]) -> None:
    check_secret_key(store)
    assert store.get_fact(SECRET_CHECK_FACT) is not None
    check_secret_key(_with_keys(store, keys[0]))  # the same key: fine, again and again
    with pytest.raises(ConfigError, match="cannot decrypt the secrets stored in the database") as refused:
        check_secret_key(_with_keys(store, keys[1]))
    assert keys[0] not in str(refused.value) and keys[1] not in str(refused.value)
    assert "test keys" in str(refused.value)  # where this instance's key came from


def test_a_database_from_before_the_check_is_judged_by_its_stored_secrets(store: SQLStore,
                                                                         keys: tuple[str, str]) -> None:
    store.create_cluster("c1", project_id="p", cluster_type="k8s")
    store.create_register_token("c1")
    # No check value yet (a database from an older version): the stored secret decides.
    with pytest.raises(ConfigError, match="cannot decrypt"):
        check_secret_key(_with_keys(store, keys[1]))
    assert store.get_fact(SECRET_CHECK_FACT) is None  # the refused instance recorded nothing
    check_secret_key(store)
    assert store.get_fact(SECRET_CHECK_FACT) is not None


def test_new_old_keys_re_encrypt_every_secret_so_the_old_key_can_go(store: SQLStore,
                                                                    keys: tuple[str, str]) -> None:
    old, new = keys
    store.create_cluster("c1", project_id="p", cluster_type="k8s")
    token = store.create_register_token("c1")
    store.report_credentials("c1", server_addresses=["https://10.0.0.1:6443"], cacert_pem="ca", user_token="sa")
    check_secret_key(store)
    with pytest.raises(ConfigError):
        check_secret_key(_with_keys(store, new))
    rotating = _with_keys(store, new, old)
    check_secret_key(rotating)  # re-encrypts everything with NEW
    assert rotating.get_fact(SECRET_KEY_ID_FACT) == SecretBox([new]).key_id()
    only_new = _with_keys(store, new)
    check_secret_key(only_new)
    assert only_new.get_register_token("c1")[0] == token
    creds = only_new.get_credentials("c1")
    assert creds is not None and creds.user_token == "sa"


def test_a_secret_no_key_decrypts_refuses_the_start_and_changes_nothing(store: SQLStore,
                                                                        keys: tuple[str, str]) -> None:
    check_secret_key(store)
    store.create_cluster("c1", project_id="p", cluster_type="k8s")
    store.create_cluster("c2", project_id="p", cluster_type="k8s")
    _with_keys(store, keys[1]).create_register_token("c1")  # written behind the gateway's back
    store.create_register_token("c2")  # the newest secret is fine; the older one is not
    store.put_fact(SECRET_KEY_ID_FACT, "another", replace=True)  # so the next check re-encrypts
    with pytest.raises(ConfigError, match="cannot decrypt"):
        check_secret_key(store)
    assert store.get_fact(SECRET_KEY_ID_FACT) == "another"  # rolled back


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        pytest.param("configured", "conflict", id="configured-other"),
        pytest.param("generated", "joined", id="generated-other"),
        pytest.param("replace", "replaced", id="replace-other"),
    ],
)
def test_a_second_bootstrap_token_is_refused_joined_or_replaces(store: SQLStore, mode: str, expected: str) -> None:
    admin = store.ensure_user("admin", is_superuser=True)
    first, second = token_digest("first-" + "f" * 40), token_digest("second-" + "s" * 40)
    assert store.claim_bootstrap_token(admin.id, first, mode="configured") == "installed"
    assert store.claim_bootstrap_token(admin.id, first, mode="configured") == "current"
    assert store.claim_bootstrap_token(admin.id, second, mode=mode) == expected  # type: ignore[arg-type]
    first_works = store.authenticate("first-" + "f" * 40) is not None
    second_works = store.authenticate("second-" + "s" * 40) is not None
    assert (first_works, second_works) == ((False, True) if mode == "replace" else (True, False))


def test_a_revoked_bootstrap_token_is_not_brought_back_by_a_start(store: SQLStore) -> None:
    admin = store.ensure_user("admin", is_superuser=True)
    old, new = "old-" + "o" * 40, "new-" + "n" * 40
    store.claim_bootstrap_token(admin.id, token_digest(old), mode="configured")
    assert store.claim_bootstrap_token(admin.id, token_digest(new), mode="replace") == "replaced"
    assert store.claim_bootstrap_token(admin.id, token_digest(old), mode="configured") == "revoked"
    assert store.authenticate(old) is None and store.authenticate(new) is not None
    # Revoked through the API, and nothing else usable: still not brought back.
    token_id = next(t.id for t in store.list_tokens(admin.id) if t.revoked_at is None)
    store.revoke_token(admin.id, token_id)
    assert store.claim_bootstrap_token(admin.id, token_digest(new), mode="configured") == "revoked"
    assert store.authenticate(new) is None


def test_another_users_token_is_not_taken_as_a_bootstrap_token(store: SQLStore) -> None:
    alice = store.create_user("alice")
    _, value = store.create_token(alice.id)
    admin = store.ensure_user("admin", is_superuser=True)
    assert store.claim_bootstrap_token(admin.id, token_digest(value), mode="replace") == "taken"
    found = store.authenticate(value)
    assert found is not None and found[0].name == "alice"


def test_the_first_ca_is_recorded_and_another_is_refused(store: SQLStore) -> None:
    first, other = trustme.CA(), trustme.CA()
    first_pem, other_pem = first.cert_pem.bytes().decode(), other.cert_pem.bytes().decode()
    check_gateway_ca(store, None, source="none")
    assert recorded_ca(store) is None  # an instance handing out no CA records nothing
    check_gateway_ca(store, first_pem, source="a.crt")
    check_gateway_ca(store, first_pem, source="a.crt")
    with pytest.raises(ConfigError, match="set-shared-ca") as refused:
        check_gateway_ca(store, other_pem, source="b.crt")
    assert "b.crt" in str(refused.value)
    before, now = record_gateway_ca(store, other_pem + first_pem)  # a bundle while clients move
    assert before is not None and now != before
    check_gateway_ca(store, first_pem + other_pem, source="bundle.crt")  # the same set, in any order
    with pytest.raises(ConfigError):
        check_gateway_ca(store, first_pem, source="a.crt")
