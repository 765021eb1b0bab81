"""The embedded gateway's PKI files in ``<data_dir>/tls/``: made once, renewed before expiry.

:func:`ensure_gateway_pki` keeps the CA (``ca.crt``, ``ca.key``) and the HTTPS certificate
(``server.crt``, ``server.key``); :func:`write_atomic` and :func:`write_pair` are how every
key and certificate of the package reaches the disk.

Security: private keys are written mode 0600 through a temporary file and
``os.replace``, so a reader never sees a half-written or world-readable key.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ..core.errors import ConfigError
from .certificates import (
    KeyPair,
    general_name_text,
    general_names,
    generate_ca,
    issue_server_cert,
    load_ca,
    load_keypair,
    san_names,
)

log = logging.getLogger(__name__)

CA_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "server.crt"
KEY_FILE = "server.key"


@dataclass(frozen=True)
class GatewayPKI:
    """What :func:`ensure_gateway_pki` found or made in ``<data_dir>/tls/``.

    :param reason: one line for the start-up log saying why the server
        certificate was (re)issued or kept; it never contains key material.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    created_ca: bool
    issued_cert: bool
    reason: str


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    # mkstemp creates the file 0600 before a byte is written; fchmod then sets the final
    # mode regardless of the umask, and os.replace makes the switch atomic for readers.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_pair(pair: KeyPair, cert_file: Path, key_file: Path) -> None:
    # Key first: a certificate on disk always has its key next to it.
    write_atomic(key_file, pair.key_pem, 0o600)
    write_atomic(cert_file, pair.cert_pem, 0o644)


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def default_gateway_hosts() -> list[str]:
    """``localhost``, ``127.0.0.1``, ``::1``, this machine's host name and its FQDN."""
    candidates = ["localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()]
    hosts: list[str] = []
    for host in candidates:
        host = host.strip().lower()
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def _server_cert_problem(
    ca_cert: x509.Certificate,
    cert_file: Path,
    key_file: Path,
    hosts: Sequence[x509.GeneralName],
    renew_before: timedelta,
) -> tuple[str | None, KeyPair | None]:
    """Why the server certificate must be reissued (``None``: it is fine), and the current
    pair when it is sound apart from that (its key can be certified again)."""
    if not cert_file.exists() or not key_file.exists():
        return "server certificate missing", None
    try:
        pair = load_keypair(cert_file, key_file)
        cert = pair.certificate
    except (OSError, ValueError, TypeError):
        return "server certificate or key unreadable", None
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return "server certificate not signed by the current CA", None
    expires = cert.not_valid_after_utc
    if expires - datetime.now(UTC) < renew_before:
        return f"server certificate expires {expires:%Y-%m-%d %H:%M} UTC, renewing early", pair
    present = san_names(cert)
    missing = [general_name_text(host) for host in hosts if host not in present]
    if missing:
        return f"server certificate does not cover {', '.join(missing)}", pair
    return None, pair


def ensure_gateway_pki(
    data_dir: Path,
    hosts: Sequence[str],
    *,
    renew_before: timedelta = timedelta(days=30),
) -> GatewayPKI:
    """Keep the embedded gateway's CA and HTTPS certificate in ``data_dir/tls/``.

    The CA (``ca.crt``, ``ca.key``) is created on the first call and reused
    forever after: clients were told to trust it. The server certificate
    (``server.crt``, ``server.key``) is (re)issued when it is missing or
    unreadable, does not match its key, is not signed by the current CA,
    expires within ``renew_before``, or does not name every one of ``hosts``;
    a reissued certificate keeps the names it had (servers sharing the data
    directory each add theirs; remove ``server.crt`` to drop names).

    The directory is mode 0700 and keys 0600. Several processes may call this
    at once (gunicorn workers, two ``serve`` starts): the whole check and
    write happens under an ``flock`` on ``tls/.lock``.

    Raises :class:`~bcs_middleware.core.errors.ConfigError` when ``ca.crt`` exists
    but its key is missing or does not match: silently making a new CA would
    break every client that trusts the old one.
    """
    tls_dir = Path(data_dir) / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls_dir, 0o700)
    ca_file, ca_key_file = tls_dir / CA_FILE, tls_dir / CA_KEY_FILE
    cert_file, key_file = tls_dir / CERT_FILE, tls_dir / KEY_FILE
    wanted = general_names(hosts)

    with locked(tls_dir / ".lock"):
        ca, created_ca = _gateway_ca(ca_file, ca_key_file)
        ca_cert = ca.certificate
        if ca_cert.not_valid_after_utc - datetime.now(UTC) < renew_before:
            log.warning(
                "gateway CA %s expires %s; replace it before then",
                ca_file,
                ca_cert.not_valid_after_utc.isoformat(),
            )

        problem, current = _server_cert_problem(ca_cert, cert_file, key_file, wanted, renew_before)
        if problem is None:
            return GatewayPKI(
                ca_file, cert_file, key_file, created_ca, False, "server certificate is valid"
            )
        _reissue_server_cert(ca, hosts, current, cert_file, key_file)
        log.info("issued gateway server certificate %s: %s", cert_file, problem)
        return GatewayPKI(ca_file, cert_file, key_file, created_ca, True, problem)


def _gateway_ca(ca_file: Path, ca_key_file: Path) -> tuple[KeyPair, bool]:
    """The CA in ``ca_file``, or a new one written there; and whether it is new."""
    # ca.crt is written after ca.key, so its presence means a complete CA.
    if ca_file.exists():
        try:
            ca = load_keypair(ca_file, ca_key_file)
            load_ca(ca)  # the key must belong to the certificate, and it must be a CA
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{ca_file} exists but the CA cannot be used ({exc}); restore {ca_key_file} "
                "or remove both files to create a new CA (clients must then trust it again)"
            ) from exc
        return ca, False
    ca = generate_ca(f"bcs-middleware CA {socket.gethostname()}")
    write_pair(ca, ca_file, ca_key_file)
    log.info("created gateway CA %s", ca_file)
    return ca, True


def _reissue_server_cert(
    ca: KeyPair, hosts: Sequence[str], current: KeyPair | None, cert_file: Path, key_file: Path
) -> None:
    """Issue the server certificate again: for ``current``'s key when it is sound, else a new pair."""
    if current is None:
        write_pair(issue_server_cert(ca, hosts), cert_file, key_file)
        return
    # Expiring or missing a host, but its key is sound: certify the same key again
    # and replace only the certificate. A running server loads both files for every
    # new connection (gunicorn's gthread and sync workers), and one atomic replace
    # never lets a connection see a new certificate with the old key. The names it
    # had stay: several servers may share the data directory, each with its own
    # --tls-host names, and must not take turns dropping each other's.
    kept = [general_name_text(name) for name in san_names(current.certificate)]
    renewed = issue_server_cert(ca, list(dict.fromkeys([*hosts, *kept])), key_pem=current.key_pem)
    write_atomic(cert_file, renewed.cert_pem, 0o644)
