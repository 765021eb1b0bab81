"""X.509 for the gateway, its admission webhooks and its machine callers: minting and inspecting.

The only module that builds X.509. Everything goes through ``cryptography``:
no ``openssl`` subprocess, no hand-written ASN.1. :func:`generate_ca`,
:func:`issue_server_cert` and :func:`issue_client_cert` make PEM :class:`KeyPair`
values in memory; :func:`cert_hosts`, :func:`cert_not_after` and :func:`host_matches`
read them. The files on disk are :mod:`.files`', renewal and the server's reloading
context :mod:`.reload`'s, the ``bcs-middleware certs`` bundles :mod:`.bundles`'.

Why the defaults are what they are: ECDSA P-256 keys (small, fast, accepted
by every TLS client in use; RSA below 2048 bits is refused by modern clients,
which is what broke the seeds' RSA-1024 CA); a server certificate lives 397
days, the longest lifetime browsers and Apple clients accept; subject
alternative names carry every name, because clients stopped reading the
common name long ago; ``not_valid_before`` is a few minutes in the past so a
client whose clock runs slightly behind does not reject a fresh certificate.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyType = Literal["ecdsa", "rsa"]
MIN_RSA_BITS = 2048
#: How far ``not_valid_before`` is set in the past, for clients with a lagging clock.
CLOCK_SKEW = timedelta(minutes=5)
#: X.509 caps a common name at 64 characters (RFC 5280 ub-common-name).
_CN_MAX = 64

_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# One DNS label (letters, digits, hyphen, underscore for SRV-style names), and a name
# of such labels with an optional leading "*." wildcard label.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


# -- building certificates ---------------------------------------------------------------


def check_key_args(key_type: str, rsa_bits: int) -> None:
    if key_type not in ("ecdsa", "rsa"):
        raise ValueError(f"key_type must be 'ecdsa' or 'rsa', not {key_type!r}")
    if key_type == "rsa" and rsa_bits < MIN_RSA_BITS:
        raise ValueError(
            f"RSA keys need at least {MIN_RSA_BITS} bits (got {rsa_bits}): "
            "TLS clients reject shorter ones"
        )


def _new_key(key_type: str, rsa_bits: int) -> _PrivateKey:
    check_key_args(key_type, rsa_bits)
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: _PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(key_pem: bytes) -> _PrivateKey:
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


def load_ca(ca: KeyPair) -> tuple[x509.Certificate, _PrivateKey]:
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = load_key(ca.key_pem)
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


def general_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        general = _normalise_host(host)
        if general not in names:
            names.append(general)
    if not names:
        raise ValueError("a server certificate needs at least one host name or IP address")
    return names


def general_name_text(name: x509.GeneralName) -> str:
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
    ca_cert, ca_key = load_ca(ca)
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
    san = general_names(hosts)
    cn = common_name if common_name is not None else general_name_text(san[0])
    subject = _name(cn if len(cn) <= _CN_MAX else None)
    return _issue_leaf(
        ca,
        subject,
        key_type=key_type,
        rsa_bits=rsa_bits,
        days=days,
        extended_usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=san,
        key=load_key(key_pem) if key_pem is not None else None,
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


def san_names(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [name for name in san if isinstance(name, x509.DNSName | x509.IPAddress)]


def cert_hosts(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses of a certificate's SAN, as strings, in order."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return [general_name_text(name) for name in san_names(cert)]


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
    names = san_names(x509.load_pem_x509_certificate(cert_pem))
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
    if cert.public_key() != load_key(pair.key_pem).public_key():
        raise ValueError(f"{key_file} is not the private key of {cert_file}")
    return pair
