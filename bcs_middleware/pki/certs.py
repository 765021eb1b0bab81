"""Certificates for the gateway, its admission webhooks and its machine callers.

The only module that builds X.509. Everything goes through ``cryptography``:
no ``openssl`` subprocess, no hand-written ASN.1.

* :func:`generate_ca`, :func:`issue_server_cert`, :func:`issue_client_cert` make
  PEM :class:`KeyPair` values in memory;
* :func:`ensure_gateway_pki` keeps the embedded gateway's CA and server
  certificate in ``<data_dir>/tls/`` (created once, renewed before expiry), and
  :class:`CertificateRenewer` runs it periodically in a serving gateway, so the
  certificate is renewed without a restart;
* :func:`write_gateway_bundle` and :func:`write_service_bundle` write the files
  of the ``bcs-middleware certs`` command for a production install or for an
  admission webhook served inside Kubernetes.

Why the defaults are what they are: ECDSA P-256 keys (small, fast, accepted
by every TLS client in use; RSA below 2048 bits is refused by modern clients,
which is what broke the seeds' RSA-1024 CA); a server certificate lives 397
days, the longest lifetime browsers and Apple clients accept; subject
alternative names carry every name, because clients stopped reading the
common name long ago; ``not_valid_before`` is a few minutes in the past so a
client whose clock runs slightly behind does not reject a fresh certificate.

Security: private keys are written mode 0600 through a temporary file and
``os.replace``, so a reader never sees a half-written or world-readable key.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import ipaddress
import logging
import os
import re
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..core.errors import ConfigError

__all__ = [
    "GatewayPKI",
    "KeyPair",
    "KeyType",
    "ServiceBundle",
    "cert_fingerprint",
    "cert_hosts",
    "cert_not_after",
    "default_gateway_hosts",
    "ensure_gateway_pki",
    "generate_ca",
    "host_matches",
    "issue_client_cert",
    "issue_server_cert",
    "load_keypair",
    "self_signed_server_cert",
    "service_hosts",
    "write_client_bundle",
    "write_gateway_bundle",
    "write_service_bundle",
]

log = logging.getLogger(__name__)

KeyType = Literal["ecdsa", "rsa"]
MIN_RSA_BITS = 2048
#: How far ``not_valid_before`` is set in the past, for clients with a lagging clock.
CLOCK_SKEW = timedelta(minutes=5)
#: X.509 caps a common name at 64 characters (RFC 5280 ub-common-name).
_CN_MAX = 64

CA_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "server.crt"
KEY_FILE = "server.key"

_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# One DNS label (letters, digits, hyphen, underscore for SRV-style names), and a name
# of such labels with an optional leading "*." wildcard label.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")
# Kubernetes: a Service name is a DNS-1035 label, a namespace a DNS-1123 label.
_K8S_SERVICE = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_K8S_NAMESPACE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


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


@dataclass(frozen=True)
class ServiceBundle:
    """Files written by :func:`write_service_bundle`.

    :param ca_bundle_b64: base64 of the CA PEM: the ``caBundle`` value of an
        admission webhook definition (bcs or ``admissionregistration.k8s.io``).
    :param hosts: the server certificate's subject alternative names.
    """

    ca_file: Path
    ca_key_file: Path
    cert_file: Path
    key_file: Path
    ca_bundle_b64: str
    hosts: tuple[str, ...]


# -- building certificates ---------------------------------------------------------------


def _check_key_args(key_type: str, rsa_bits: int) -> None:
    if key_type not in ("ecdsa", "rsa"):
        raise ValueError(f"key_type must be 'ecdsa' or 'rsa', not {key_type!r}")
    if key_type == "rsa" and rsa_bits < MIN_RSA_BITS:
        raise ValueError(
            f"RSA keys need at least {MIN_RSA_BITS} bits (got {rsa_bits}): "
            "TLS clients reject shorter ones"
        )


def _new_key(key_type: str, rsa_bits: int) -> _PrivateKey:
    _check_key_args(key_type, rsa_bits)
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: _PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(key_pem: bytes) -> _PrivateKey:
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError("only ECDSA and RSA private keys are supported")
    return key


def _name(common_name: str | None, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name[:_CN_MAX]))
    return x509.Name(attrs)


def _validity(days: int, not_after_cap: datetime | None = None) -> tuple[datetime, datetime]:
    if days < 1:
        raise ValueError(f"days must be at least 1 (got {days})")
    now = datetime.now(UTC)
    not_after = now + timedelta(days=days)
    # A leaf outliving its CA would fail verification anyway; say the truth in the leaf.
    if not_after_cap is not None and not_after > not_after_cap:
        not_after = not_after_cap
    return now - CLOCK_SKEW, not_after


def _load_ca(ca: KeyPair) -> tuple[x509.Certificate, _PrivateKey]:
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = _load_key(ca.key_pem)
    if cert.public_key() != key.public_key():
        raise ValueError("the CA private key does not belong to the CA certificate")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise ValueError("the CA certificate is not a CA (BasicConstraints ca=True missing)")
    return cert, key


def _sign(builder: x509.CertificateBuilder, key: _PrivateKey) -> x509.Certificate:
    return builder.sign(key, hashes.SHA256())


def _key_usage(*, signs_certs: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not signs_certs,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certs,
        crl_sign=signs_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: _PrivateKey,
    days: int,
    *,
    usage: x509.KeyUsage,
    not_after_cap: datetime | None = None,
) -> x509.CertificateBuilder:
    not_before, not_after = _validity(days, not_after_cap)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.BasicConstraints(
                ca=usage.key_cert_sign, path_length=0 if usage.key_cert_sign else None
            ),
            critical=True,
        )
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def generate_ca(
    common_name: str,
    *,
    key_type: KeyType = "ecdsa",
    rsa_bits: int = 3072,
    days: int = 3650,
) -> KeyPair:
    """Make a self-signed CA that may sign leaf certificates only (``path_length=0``)."""
    key = _new_key(key_type, rsa_bits)
    subject = _name(common_name, ("bcs-middleware",))
    builder = _builder(subject, subject, key, days, usage=_key_usage(signs_certs=True))
    cert = _sign(builder, key)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def self_signed_server_cert(common_name: str, *, days: int = 397) -> KeyPair:
    """A self-signed ECDSA server certificate, for a peer trusted by its fingerprint rather than a CA.

    :func:`cert_fingerprint` of it is what the peer's callers pin.
    """
    key = _new_key("ecdsa", 3072)
    subject = _name(common_name, ("bcs-middleware",))
    builder = _builder(subject, subject, key, days, usage=_key_usage()).add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
    )
    cert = _sign(builder, key)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def cert_fingerprint(cert: bytes) -> str:
    """SHA-256 of a certificate's DER encoding (given as PEM or DER), lower-case hex."""
    der = x509.load_pem_x509_certificate(cert).public_bytes(serialization.Encoding.DER) \
        if cert.lstrip().startswith(b"-----") else cert
    return hashlib.sha256(der).hexdigest()


def _normalise_host(host: str) -> x509.GeneralName:
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        # A zone index ("fe80::1%eth0") means nothing to a peer: certify the address.
        return x509.IPAddress(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        pass
    name = text.rstrip(".").lower()
    if name and not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"not a valid host name: {host!r}") from exc
    if len(name) > 253 or not _DNS_NAME.match(name):
        raise ValueError(f"not a valid host name or IP address: {host!r}")
    return x509.DNSName(name)


def _general_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        general = _normalise_host(host)
        if general not in names:
            names.append(general)
    if not names:
        raise ValueError("a server certificate needs at least one host name or IP address")
    return names


def _general_name_text(name: x509.GeneralName) -> str:
    return str(name.value)


def _issue_leaf(
    ca: KeyPair,
    subject: x509.Name,
    *,
    key_type: str,
    rsa_bits: int,
    days: int,
    extended_usage: x509.ObjectIdentifier,
    san: list[x509.GeneralName] | None,
    key: _PrivateKey | None = None,
) -> KeyPair:
    ca_cert, ca_key = _load_ca(ca)
    if key is None:
        key = _new_key(key_type, rsa_bits)
    else:
        key_type = "rsa" if isinstance(key, rsa.RSAPrivateKey) else "ecdsa"
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    # RSA key exchange (TLS 1.2 without ECDHE) encrypts to the key.
    key_usage = _key_usage(key_encipherment=key_type == "rsa")
    builder = (
        _builder(
            subject,
            ca_cert.subject,
            key,
            days,
            usage=key_usage,
            not_after_cap=ca_cert.not_valid_after_utc,
        )
        .add_extension(x509.ExtendedKeyUsage([extended_usage]), critical=False)
        .add_extension(aki, critical=False)
    )
    if san:
        # RFC 5280 4.2.1.6: with an empty subject the SAN extension must be critical.
        builder = builder.add_extension(
            x509.SubjectAlternativeName(san), critical=len(subject) == 0
        )
    cert = _sign(builder, ca_key)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server_cert(
    ca: KeyPair,
    hosts: Sequence[str],
    *,
    key_type: KeyType = "ecdsa",
    rsa_bits: int = 3072,
    days: int = 397,
    common_name: str | None = None,
    key_pem: bytes | None = None,
) -> KeyPair:
    """Issue a TLS server certificate for ``hosts`` signed by ``ca``.

    ``key_pem`` certifies an existing private key (a renewal) instead of a new one
    (``key_type``/``rsa_bits`` are then ignored).

    Host names become ``DNSName`` entries (lower-cased, IDNA-encoded, a
    leading ``*.`` allowed), IPv4 and IPv6 addresses ``IPAddress`` entries
    (normalised: ``0:0::1`` is ``::1``; ``[::1]`` is accepted). The validity
    is cut at the CA's own expiry. Raises :class:`ValueError` on an invalid
    host, no host at all, or an unusable CA.
    """
    san = _general_names(hosts)
    cn = common_name if common_name is not None else _general_name_text(san[0])
    subject = _name(cn if len(cn) <= _CN_MAX else None)
    return _issue_leaf(
        ca,
        subject,
        key_type=key_type,
        rsa_bits=rsa_bits,
        days=days,
        extended_usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=san,
        key=_load_key(key_pem) if key_pem is not None else None,
    )


def issue_client_cert(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: Sequence[str] = (),
    key_type: KeyType = "ecdsa",
    rsa_bits: int = 3072,
    days: int = 365,
) -> KeyPair:
    """Issue a TLS client certificate (``clientAuth``) for a machine caller.

    The subject follows the Kubernetes convention: ``CN`` names the caller,
    each ``O`` one of its groups, so a subject can be mapped to a user or a
    cluster.
    """
    if not common_name or len(common_name) > _CN_MAX:
        raise ValueError(f"a client common name needs 1 to {_CN_MAX} characters")
    return _issue_leaf(
        ca,
        _name(common_name, organizations),
        key_type=key_type,
        rsa_bits=rsa_bits,
        days=days,
        extended_usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        san=None,
    )


# -- inspecting certificates -------------------------------------------------------------


def _san_names(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [name for name in san if isinstance(name, x509.DNSName | x509.IPAddress)]


def cert_hosts(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses of a certificate's SAN, as strings, in order."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return [_general_name_text(name) for name in _san_names(cert)]


def cert_not_after(cert_pem: bytes) -> datetime:
    """The certificate's expiry as an aware UTC datetime."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def host_matches(cert_pem: bytes, host: str) -> bool:
    """Whether a client reaching ``host`` accepts this certificate's names.

    Exact DNS names (case-insensitive, trailing dot ignored), IP addresses
    compared as addresses, and a wildcard ``*.example.com`` matching exactly
    one extra label (``a.example.com``, not ``example.com`` nor
    ``a.b.example.com``), as RFC 6125 and every TLS client do. A wildcard
    never matches an IP address.
    """
    try:
        wanted = _normalise_host(host)
    except ValueError:
        return False
    names = _san_names(x509.load_pem_x509_certificate(cert_pem))
    if isinstance(wanted, x509.IPAddress):
        return any(isinstance(n, x509.IPAddress) and n.value == wanted.value for n in names)
    target = wanted.value
    for name in names:
        if not isinstance(name, x509.DNSName):
            continue
        pattern = name.value.lower().rstrip(".")
        if pattern == target:
            return True
        if pattern.startswith("*."):
            label, _, rest = target.partition(".")
            if label and label != "*" and rest == pattern[2:]:
                return True
    return False


def load_keypair(cert_file: Path, key_file: Path) -> KeyPair:
    """Read a certificate and its key from files; :class:`ValueError` if they do not match."""
    pair = KeyPair(Path(cert_file).read_bytes(), Path(key_file).read_bytes())
    cert = pair.certificate
    if cert.public_key() != _load_key(pair.key_pem).public_key():
        raise ValueError(f"{key_file} is not the private key of {cert_file}")
    return pair


# -- files -------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
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


def _write_pair(pair: KeyPair, cert_file: Path, key_file: Path) -> None:
    # Key first: a certificate on disk always has its key next to it.
    _write_atomic(key_file, pair.key_pem, 0o600)
    _write_atomic(cert_file, pair.cert_pem, 0o644)


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
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
    present = _san_names(cert)
    missing = [_general_name_text(host) for host in hosts if host not in present]
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
    wanted = _general_names(hosts)

    with _locked(tls_dir / ".lock"):
        created_ca = False
        # ca.crt is written after ca.key, so its presence means a complete CA.
        if ca_file.exists():
            try:
                ca = load_keypair(ca_file, ca_key_file)
                ca_cert, _ = _load_ca(ca)
            except (OSError, ValueError, TypeError) as exc:
                raise ConfigError(
                    f"{ca_file} exists but the CA cannot be used ({exc}); restore {ca_key_file} "
                    "or remove both files to create a new CA (clients must then trust it again)"
                ) from exc
        else:
            ca = generate_ca(f"bcs-middleware CA {socket.gethostname()}")
            _write_pair(ca, ca_file, ca_key_file)
            ca_cert = ca.certificate
            created_ca = True
            log.info("created gateway CA %s", ca_file)
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
        if current is not None:
            # Expiring or missing a host, but its key is sound: certify the same key again
            # and replace only the certificate. A running server loads both files for every
            # new connection (gunicorn's gthread and sync workers), and one atomic replace
            # never lets a connection see a new certificate with the old key. The names it
            # had stay: several servers may share the data directory, each with its own
            # --tls-host names, and must not take turns dropping each other's.
            kept = [_general_name_text(name) for name in _san_names(current.certificate)]
            renewed = issue_server_cert(ca, list(dict.fromkeys([*hosts, *kept])), key_pem=current.key_pem)
            _write_atomic(cert_file, renewed.cert_pem, 0o644)
        else:
            _write_pair(issue_server_cert(ca, hosts), cert_file, key_file)
        log.info("issued gateway server certificate %s: %s", cert_file, problem)
        return GatewayPKI(ca_file, cert_file, key_file, created_ca, True, problem)


class CertificateRenewer:
    """Check the embedded gateway's certificate every ``interval`` seconds while it serves.

    :func:`ensure_gateway_pki` renews the server certificate ``renew_before`` its
    expiry (certifying the same key again, one atomic file replace). gunicorn's
    workers take every new connection's context from :class:`ServerContext` (``serve``'s
    ``ssl_context`` hook; the gateway's gevent worker asks it again when the files change,
    :mod:`bcs_middleware.serving.gevent_worker`), which reloads the files when they changed, so the
    renewed certificate is served from the next connection on: a gateway that
    runs for longer than a certificate lives needs no restart. Run it in one process
    (the gunicorn master); a failed check is logged and retried at the next interval.
    """

    def __init__(self, data_dir: Path, hosts: Sequence[str], *, interval: float,
                 renew_before: timedelta = timedelta(days=30)) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive (got {interval})")
        self.data_dir = Path(data_dir)
        self.hosts = list(hosts)
        self.interval = interval
        self.renew_before = renew_before
        self._thread: threading.Thread | None = None

    def check(self) -> GatewayPKI | None:
        """One check (and renewal when due); ``None`` when it failed (logged)."""
        try:
            pki = ensure_gateway_pki(self.data_dir, self.hosts, renew_before=self.renew_before)
        except Exception as exc:  # the server keeps serving its current certificate
            log.warning("checking the gateway certificate failed (%s); retrying in %.0f s",
                        type(exc).__name__, self.interval)
            return None
        if pki.issued_cert:
            log.info("renewed the gateway certificate %s (%s); new connections get it",
                     pki.cert_file, pki.reason)
        return pki

    def start(self) -> None:
        """Check every ``interval`` from now on, on a daemon thread (it ends with the process)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bcs-cert-renewer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.check()


def _file_version(path: str | None) -> int:
    if not path:
        return 0
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


class ServerContext:
    """The server side's TLS context, rebuilt when the certificate files change.

    gunicorn's gthread worker asks for a context on every new connection and its default
    factory parses the certificate chain and key each time; the gevent worker asks once
    and keeps it for the worker's life. Both only call ``wrap_socket`` on it, so this
    object builds one ``SSLContext`` per version (modification times) of the files and
    hands each connection to the current one: a connection costs the handshake only, TLS
    sessions can be resumed (tickets are per context), and a renewed certificate (see
    :class:`CertificateRenewer`) is served from the next connection on under either worker.
    """

    def __init__(self, conf: Any, factory: Callable[[], ssl.SSLContext]) -> None:
        self._conf = conf
        self._factory = factory
        self._current: tuple[tuple[int, ...], ssl.SSLContext] | None = None

    def context(self) -> ssl.SSLContext:
        conf = self._conf
        version = (_file_version(conf.certfile), _file_version(conf.keyfile), _file_version(conf.ca_certs))
        current = self._current
        if current is None or current[0] != version:
            # Two threads may build it at once after a change; either result is right.
            current = self._current = (version, self._factory())
        return current[1]

    def wrap_socket(self, sock: socket.socket, **kwargs: Any) -> ssl.SSLSocket:
        return self.context().wrap_socket(sock, **kwargs)


_server_context: ServerContext | None = None


def gunicorn_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ServerContext:
    """gunicorn's ``ssl_context`` server hook: this process's :class:`ServerContext`."""
    global _server_context
    if _server_context is None:
        _server_context = ServerContext(conf, default_ssl_context_factory)
    return _server_context


def _prepare_out_dir(out_dir: Path, files: Sequence[Path], force: bool) -> None:
    if not out_dir.exists():
        # Only a directory we create gets the restrictive mode: never chmod the caller's cwd.
        out_dir.mkdir(parents=True, mode=0o700)
    existing = [str(path) for path in files if path.exists()]
    if existing and not force:
        raise FileExistsError(
            f"refusing to overwrite {', '.join(existing)} (use force to replace them)"
        )


def write_gateway_bundle(
    out_dir: Path,
    hosts: Sequence[str],
    *,
    key_type: KeyType = "ecdsa",
    rsa_bits: int = 3072,
    force: bool = False,
) -> dict[str, Path]:
    """Write ``ca.crt ca.key server.crt server.key`` for a production gateway.

    Returns the paths under the keys ``ca_file``, ``ca_key_file``,
    ``cert_file`` and ``key_file``. Raises :class:`FileExistsError` if any of
    the files exists and ``force`` is false, :class:`ValueError` on a bad
    host or key size.
    """
    out_dir = Path(out_dir)
    paths = {
        "ca_file": out_dir / CA_FILE,
        "ca_key_file": out_dir / CA_KEY_FILE,
        "cert_file": out_dir / CERT_FILE,
        "key_file": out_dir / KEY_FILE,
    }
    names = _general_names(hosts)  # validate before touching the disk
    _check_key_args(key_type, rsa_bits)
    _prepare_out_dir(out_dir, list(paths.values()), force)
    ca = generate_ca(
        f"bcs-middleware gateway CA {_general_name_text(names[0])}",
        key_type=key_type,
        rsa_bits=rsa_bits,
    )
    server = issue_server_cert(ca, hosts, key_type=key_type, rsa_bits=rsa_bits)
    _write_pair(ca, paths["ca_file"], paths["ca_key_file"])
    _write_pair(server, paths["cert_file"], paths["key_file"])
    return paths


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names a Kubernetes Service is reached by: ``NAME.NS``, ``NAME.NS.svc`` and FQDN."""
    if not _K8S_SERVICE.match(service):
        raise ValueError(f"not a valid Kubernetes service name (DNS-1035 label): {service!r}")
    if not _K8S_NAMESPACE.match(namespace):
        raise ValueError(f"not a valid Kubernetes namespace (DNS-1123 label): {namespace!r}")
    base = f"{service}.{namespace}"
    return [base, f"{base}.svc", f"{base}.svc.cluster.local"]


def write_service_bundle(
    out_dir: Path,
    service: str,
    namespace: str,
    *,
    extra_hosts: Sequence[str] = (),
    key_type: KeyType = "ecdsa",
    rsa_bits: int = 3072,
    force: bool = False,
) -> ServiceBundle:
    """Write a CA and a server certificate for an admission webhook Service.

    The certificate names ``NAME.NS``, ``NAME.NS.svc`` and
    ``NAME.NS.svc.cluster.local`` plus ``extra_hosts``; the returned
    :attr:`ServiceBundle.ca_bundle_b64` goes into the webhook definition's
    ``caBundle``. Same overwrite rule as :func:`write_gateway_bundle`.
    """
    out_dir = Path(out_dir)
    hosts = service_hosts(service, namespace) + list(extra_hosts)
    names = _general_names(hosts)
    _check_key_args(key_type, rsa_bits)
    ca_file, ca_key_file = out_dir / CA_FILE, out_dir / CA_KEY_FILE
    cert_file, key_file = out_dir / CERT_FILE, out_dir / KEY_FILE
    _prepare_out_dir(out_dir, [ca_file, ca_key_file, cert_file, key_file], force)
    ca = generate_ca(
        f"bcs-middleware webhook CA {service}.{namespace}", key_type=key_type, rsa_bits=rsa_bits
    )
    server = issue_server_cert(ca, hosts, key_type=key_type, rsa_bits=rsa_bits)
    _write_pair(ca, ca_file, ca_key_file)
    _write_pair(server, cert_file, key_file)
    return ServiceBundle(
        ca_file=ca_file,
        ca_key_file=ca_key_file,
        cert_file=cert_file,
        key_file=key_file,
        ca_bundle_b64=base64.b64encode(ca.cert_pem).decode("ascii"),
        hosts=tuple(_general_name_text(name) for name in names),
    )


def write_client_bundle(
    out_dir: Path,
    ca_dir: Path,
    common_name: str,
    *,
    organizations: Sequence[str] = (),
    force: bool = False,
) -> dict[str, Path]:
    """Write ``client.crt client.key`` signed by the CA in ``ca_dir`` (``ca.crt``, ``ca.key``).

    Returns the paths under ``cert_file`` and ``key_file``. Raises
    :class:`FileExistsError` as :func:`write_gateway_bundle` does, and
    :class:`ValueError` when the CA files do not form a usable CA.
    """
    out_dir, ca_dir = Path(out_dir), Path(ca_dir)
    ca = load_keypair(ca_dir / CA_FILE, ca_dir / CA_KEY_FILE)
    paths = {"cert_file": out_dir / "client.crt", "key_file": out_dir / "client.key"}
    client = issue_client_cert(ca, common_name, organizations=organizations)
    _prepare_out_dir(out_dir, list(paths.values()), force)
    _write_pair(client, paths["cert_file"], paths["key_file"])
    return paths
