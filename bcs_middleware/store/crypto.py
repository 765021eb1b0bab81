"""Encryption at rest for secrets the gateway must read back, and hashing for those it must not.

* Register tokens and cluster credentials are encrypted with Fernet. Several keys
  may be configured (comma-separated): the first encrypts, all decrypt
  (``MultiFernet``), so a key can be rotated without downtime.
* User tokens are 256-bit random values stored only as a SHA-256 digest. A
  plain digest (not a slow KDF) is right here: the input already has 256 bits
  of entropy, and the lookup sits on every request's hot path.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..core.errors import ConfigError

log = logging.getLogger(__name__)

KEY_FILE = "secret.key"


def new_token() -> str:
    """256 random bits, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def digests_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class SecretBox:
    """Encrypts and decrypts short secrets; the first key is the current one.

    :param origin: where the keys came from, for messages (never the keys themselves).
    """

    def __init__(self, keys: Sequence[str | bytes], *, origin: str = "the configured secret key") -> None:
        #: no key configured: fine for components that never read secrets back
        #: (token checks, admission definitions); any use of one is a clear error.
        self.locked = not keys
        self.origin = origin
        if not keys:
            self._fernet = None
            return
        try:
            fernets = [Fernet(k) for k in keys]
        except (ValueError, TypeError):
            # The key itself must never appear in an error.
            raise ConfigError(
                "a secret key is not a valid Fernet key (32 url-safe base64-encoded bytes); "
                "make one with: bcs-middleware keygen"
            ) from None
        self._fernet = MultiFernet(fernets)
        self._material = tuple(base64.urlsafe_b64decode(k) for k in keys)

    def derive(self, purpose: bytes) -> tuple[bytes, ...]:
        """32-byte keys for another use than encryption at rest, one per configured key (first: current).

        HKDF with ``purpose`` as its info: a key derived for one purpose reveals nothing of
        the Fernet key or of a key derived for another (the peer link's MACs, for example).
        """
        if self._fernet is None:
            raise ConfigError("no secret key is configured: set secret_key or env BCS_SECRET_KEY")
        return tuple(
            HKDF(algorithm=hashes.SHA256(), length=32, salt=b"bcs-middleware", info=purpose).derive(material)
            for material in self._material
        )

    def _box(self) -> MultiFernet:
        if self._fernet is None:
            raise ConfigError("no secret key is configured: set secret_key or env BCS_SECRET_KEY")
        return self._fernet

    def encrypt(self, plaintext: str) -> str:
        return self._box().encrypt(plaintext.encode("utf-8")).decode("ascii")

    def decrypt(self, ciphertext: str) -> str:
        try:
            return self._box().decrypt(ciphertext.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise ConfigError(
                "a stored secret cannot be decrypted with the configured keys "
                "(was the secret key changed without keeping the old one?)"
            ) from None

    def can_decrypt(self, ciphertext: str) -> bool:
        """Whether one of the keys decrypts ``ciphertext`` (a stored secret, or the instance check)."""
        try:
            self._box().decrypt(ciphertext.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            return False
        return True

    def key_id(self) -> str:
        """A name for the current (first) key that reveals nothing of it (an HKDF derivation)."""
        return hashlib.sha256(self.derive(b"bcs-middleware key id")[0]).hexdigest()[:16]

    def rotate(self, ciphertext: str) -> str:
        """``ciphertext`` encrypted again with the current key."""
        try:
            return self._box().rotate(ciphertext.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise ConfigError(
                "a stored secret cannot be decrypted with the configured keys "
                "(was the secret key changed without keeping the old one?)"
            ) from None


def load_keys(configured: str | None, data_dir: Path | None) -> list[str]:
    """Keys from configuration, else env ``BCS_SECRET_KEY``, else ``DATA_DIR/secret.key``
    (see :func:`load_key_source`)."""
    return load_key_source(configured, data_dir)[0]


def load_key_source(configured: str | None, data_dir: Path | None) -> tuple[list[str], str]:
    """Keys from configuration, else env ``BCS_SECRET_KEY``, else ``DATA_DIR/secret.key``; and
    where they came from, in words (for messages: never a key).

    The key file is generated (mode 0600) on first use. Without a data directory
    and without a configured key there are no keys: the store still works for
    everything that never reads a secret back, and refuses clearly what does.
    """
    if configured:
        return _split(configured), "the configured secret_key"
    if os.environ.get("BCS_SECRET_KEY"):
        return _split(os.environ["BCS_SECRET_KEY"]), "env BCS_SECRET_KEY"
    if data_dir is None:
        return [], "no key"  # a locked box: see SecretBox.locked
    path = Path(data_dir) / KEY_FILE
    origin = str(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Fernet.generate_key()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another worker won the race; read its key below
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(key + b"\n")
            log.info("generated a new secret key in %s", path)
            origin = f"{path}, generated by this start"
    elif path.stat().st_mode & 0o077:
        # An older version, or a restored backup, left it readable to others.
        try:
            path.chmod(0o600)
        except PermissionError:
            log.warning("secret key file %s is readable by other users and not ours to chmod", path)
    text = ""
    for _ in range(100):  # bounded: the winning worker writes 45 bytes right after creating
        text = path.read_text().strip()
        if text:
            break
        time.sleep(0.02)
    if not text:
        raise ConfigError(f"secret key file {path} is empty")
    return _split(text.replace("\n", ",")), origin


def _split(raw: str) -> list[str]:
    return [k.strip() for k in raw.split(",") if k.strip()]
