"""Certificates built by bcs_middleware.pki, checked with ``cryptography`` and a real TLS socket."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import logging
import multiprocessing
import os
import socket
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.pki import bundles, certificates, files, reload

HOSTS = ["localhost", "127.0.0.1", "::1"]


@pytest.fixture(scope="module")
def ca() -> certificates.KeyPair:
    return certificates.generate_ca("test CA")


@pytest.fixture(scope="module")
def server(ca: certificates.KeyPair) -> certificates.KeyPair:
    return certificates.issue_server_cert(ca, ["localhost", "gw.example.com", "127.0.0.1", "::1"])


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def ext(cert: x509.Certificate, kind: type[Any]) -> x509.Extension[Any]:
    return cert.extensions.get_extension_for_class(kind)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- CA ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_type", "rsa_bits", "key_class", "size"),
    [
        pytest.param("ecdsa", 3072, ec.EllipticCurvePrivateKey, 256, id="ecdsa-p256"),
        pytest.param("rsa", 2048, rsa.RSAPrivateKey, 2048, id="rsa-2048"),
    ],
)
def test_ca_has_the_requested_key_and_ca_flags(
    key_type: certificates.KeyType, rsa_bits: int, key_class: type[Any], size: int
) -> None:
    pair = certificates.generate_ca("my CA", key_type=key_type, rsa_bits=rsa_bits)
    cert = load(pair.cert_pem)
    key = certificates.load_key(pair.key_pem)
    assert isinstance(key, key_class)
    assert key.key_size == size
    if key_type == "ecdsa":
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert isinstance(key.curve, ec.SECP256R1)
    assert cert.public_key() == key.public_key()

    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca is True
    assert constraints.value.path_length == 0
    usage = ext(cert, x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    ski = ext(cert, x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "my CA"
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)

    now = datetime.now(UTC)
    assert cert.not_valid_before_utc < now
    assert abs(cert.not_valid_after_utc - (now + timedelta(days=3650))) < timedelta(minutes=1)


def test_rsa_default_size_is_3072() -> None:
    key = certificates.load_key(certificates.generate_ca("big", key_type="rsa").key_pem)
    assert key.key_size == 3072


@pytest.mark.parametrize(
    ("key_type", "rsa_bits"),
    [
        pytest.param("rsa", 1024, id="rsa-1024-as-in-the-seeds"),
        pytest.param("rsa", 2047, id="rsa-2047"),
        pytest.param("dsa", 2048, id="unknown-key-type"),
    ],
)
def test_weak_or_unknown_keys_are_refused(key_type: Any, rsa_bits: int, ca: certificates.KeyPair) -> None:
    with pytest.raises(ValueError):
        certificates.generate_ca("weak", key_type=key_type, rsa_bits=rsa_bits)
    with pytest.raises(ValueError):
        certificates.issue_server_cert(ca, ["localhost"], key_type=key_type, rsa_bits=rsa_bits)


# -- server certificates -----------------------------------------------------------------


def test_server_cert_sans_split_dns_and_ip(ca: certificates.KeyPair) -> None:
    pair = certificates.issue_server_cert(
        ca, ["LocalHost.", "gw.example.com", "127.0.0.1", "0:0::1", "[fe80::1]", "localhost"]
    )
    san = ext(load(pair.cert_pem), x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "gw.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("fe80::1"),
    ]
    assert certificates.cert_hosts(pair.cert_pem) == [
        "localhost",
        "gw.example.com",
        "127.0.0.1",
        "::1",
        "fe80::1",
    ]


def test_server_cert_is_a_leaf_for_server_auth_signed_by_the_ca(
    ca: certificates.KeyPair, server: certificates.KeyPair
) -> None:
    ca_cert, cert = load(ca.cert_pem), load(server.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    assert cert.issuer == ca_cert.subject
    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca is False
    assert list(ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ext(cert, x509.KeyUsage).value.digital_signature
    aki = ext(cert, x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ext(ca_cert, x509.SubjectKeyIdentifier).value.digest
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "localhost"
    key = certificates.load_key(server.key_pem)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert cert.public_key() == key.public_key()


def test_server_cert_validity_allows_clock_skew_and_lasts_397_days(server: certificates.KeyPair) -> None:
    cert = load(server.cert_pem)
    now = datetime.now(UTC)
    assert now - timedelta(minutes=10) < cert.not_valid_before_utc <= now - timedelta(minutes=4)
    assert abs(cert.not_valid_after_utc - (now + timedelta(days=397))) < timedelta(minutes=1)
    assert certificates.cert_not_after(server.cert_pem) == cert.not_valid_after_utc


def test_server_cert_never_outlives_its_ca() -> None:
    short_ca = certificates.generate_ca("short", days=10)
    leaf = certificates.issue_server_cert(short_ca, ["localhost"], days=397)
    assert certificates.cert_not_after(leaf.cert_pem) <= certificates.cert_not_after(short_ca.cert_pem)


def test_serials_are_random_and_distinct(ca: certificates.KeyPair) -> None:
    serials = {load(certificates.issue_server_cert(ca, ["a"]).cert_pem).serial_number for _ in range(3)}
    assert len(serials) == 3
    assert all(s.bit_length() > 64 for s in serials)


def test_rsa_server_cert(ca: certificates.KeyPair) -> None:
    pair = certificates.issue_server_cert(ca, ["localhost"], key_type="rsa", rsa_bits=2048)
    key = certificates.load_key(pair.key_pem)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert ext(load(pair.cert_pem), x509.KeyUsage).value.key_encipherment


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param([], id="no-host"),
        pytest.param([""], id="empty"),
        pytest.param(["exa mple.com"], id="space"),
        pytest.param(["bad!host"], id="punctuation"),
        pytest.param(["-leading.example.com"], id="leading-hyphen"),
        pytest.param(["a.*.example.com"], id="inner-wildcard"),
        pytest.param(["a" * 64 + ".com"], id="label-too-long"),
    ],
)
def test_invalid_hosts_are_refused(ca: certificates.KeyPair, hosts: list[str]) -> None:
    with pytest.raises(ValueError):
        certificates.issue_server_cert(ca, hosts)


def test_a_ca_key_that_does_not_match_is_refused(ca: certificates.KeyPair) -> None:
    other = certificates.generate_ca("other")
    with pytest.raises(ValueError, match="does not belong"):
        certificates.issue_server_cert(certificates.KeyPair(ca.cert_pem, other.key_pem), ["localhost"])


def test_a_leaf_cannot_act_as_ca(ca: certificates.KeyPair, server: certificates.KeyPair) -> None:
    with pytest.raises(ValueError, match="not a CA"):
        certificates.issue_server_cert(server, ["localhost"])


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("gw.example.com", True, id="exact"),
        pytest.param("GW.Example.COM.", True, id="case-and-trailing-dot"),
        pytest.param("127.0.0.1", True, id="ipv4"),
        pytest.param("0:0:0:0:0:0:0:1", True, id="ipv6-long-form"),
        pytest.param("[::1]", True, id="ipv6-bracketed"),
        pytest.param("a.wild.example.com", True, id="wildcard-one-label"),
        pytest.param("a.b.wild.example.com", False, id="wildcard-not-two-labels"),
        pytest.param("wild.example.com", False, id="wildcard-not-apex"),
        pytest.param("example.com", False, id="parent-not-covered"),
        pytest.param("10.0.0.1", False, id="other-ip"),
        pytest.param("not a host", False, id="garbage"),
    ],
)
def test_host_matches(ca: certificates.KeyPair, host: str, expected: bool) -> None:
    pair = certificates.issue_server_cert(ca, ["gw.example.com", "*.wild.example.com", "127.0.0.1", "::1"])
    assert certificates.host_matches(pair.cert_pem, host) is expected


def test_wildcard_never_matches_an_ip(ca: certificates.KeyPair) -> None:
    pair = certificates.issue_server_cert(ca, ["*.0.0.1"])
    assert not certificates.host_matches(pair.cert_pem, "127.0.0.1")


# -- client certificates -----------------------------------------------------------------


def test_client_cert_carries_subject_and_client_auth(ca: certificates.KeyPair) -> None:
    pair = certificates.issue_client_cert(ca, "kube-agent", organizations=("clusters", "BCS-K8S-001"))
    cert = load(pair.cert_pem)
    cert.verify_directly_issued_by(load(ca.cert_pem))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-agent"
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["clusters", "BCS-K8S-001"]
    assert list(ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert ext(cert, x509.BasicConstraints).value.ca is False
    assert certificates.cert_hosts(pair.cert_pem) == []
    now = datetime.now(UTC)
    assert abs(cert.not_valid_after_utc - (now + timedelta(days=365))) < timedelta(minutes=1)


# -- default hosts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostname", "fqdn", "expected_tail"),
    [
        pytest.param(
            "Node1", "node1.example.com", ["node1", "node1.example.com"], id="fqdn-differs"
        ),
        pytest.param("node1", "node1", ["node1"], id="fqdn-same"),
        pytest.param("localhost", "localhost", [], id="all-local"),
    ],
)
def test_default_gateway_hosts(
    monkeypatch: pytest.MonkeyPatch, hostname: str, fqdn: str, expected_tail: list[str]
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    monkeypatch.setattr(socket, "getfqdn", lambda name="": fqdn)
    assert files.default_gateway_hosts() == ["localhost", "127.0.0.1", "::1", *expected_tail]


def test_default_gateway_hosts_are_valid_for_a_certificate(ca: certificates.KeyPair) -> None:
    hosts = files.default_gateway_hosts()
    assert hosts[:3] == HOSTS
    assert len(hosts) == len(set(hosts))
    certificates.issue_server_cert(ca, hosts)


# -- ensure_gateway_pki ------------------------------------------------------------------


def tls_files(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((data_dir / "tls").iterdir())}


def test_first_start_creates_ca_and_server_cert_with_private_modes(tmp_path: Path) -> None:
    pki = files.ensure_gateway_pki(tmp_path, [*HOSTS, "gw.example.com"])
    tls_dir = tmp_path / "tls"
    assert pki.created_ca and pki.issued_cert
    assert pki.reason == "server certificate missing"
    assert (pki.ca_file, pki.cert_file, pki.key_file) == (
        tls_dir / "ca.crt",
        tls_dir / "server.crt",
        tls_dir / "server.key",
    )
    assert mode(tls_dir) == 0o700
    assert mode(tls_dir / "ca.key") == 0o600
    assert mode(pki.key_file) == 0o600
    # Only our files: no temporary file left behind by the atomic writes.
    assert sorted(tls_files(tmp_path)) == [".lock", "ca.crt", "ca.key", "server.crt", "server.key"]
    ca_cert, cert = load(pki.ca_file.read_bytes()), load(pki.cert_file.read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    assert certificates.cert_hosts(pki.cert_file.read_bytes()) == [*HOSTS, "gw.example.com"]
    certificates.load_keypair(pki.cert_file, pki.key_file)


def test_private_keys_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    finally:
        os.umask(old)
    assert mode(pki.key_file) == 0o600
    assert mode(tmp_path / "tls" / "ca.key") == 0o600
    assert mode(pki.cert_file) == 0o644


def test_second_start_reuses_everything(tmp_path: Path) -> None:
    files.ensure_gateway_pki(tmp_path, HOSTS)
    before = tls_files(tmp_path)
    pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    assert not pki.created_ca and not pki.issued_cert
    assert pki.reason == "server certificate is valid"
    assert tls_files(tmp_path) == before


def test_fewer_hosts_than_certified_keep_the_cert(tmp_path: Path) -> None:
    files.ensure_gateway_pki(tmp_path, [*HOSTS, "extra.example.com"])
    assert not files.ensure_gateway_pki(tmp_path, ["LOCALHOST", "0::1"]).issued_cert


def test_a_new_host_reissues_the_cert_and_keeps_the_ca(tmp_path: Path) -> None:
    first = files.ensure_gateway_pki(tmp_path, HOSTS)
    ca_before = first.ca_file.read_bytes()
    pki = files.ensure_gateway_pki(tmp_path, [*HOSTS, "gw.example.com", "10.1.2.3"])
    assert pki.issued_cert and not pki.created_ca
    assert pki.reason == "server certificate does not cover gw.example.com, 10.1.2.3"
    assert pki.ca_file.read_bytes() == ca_before
    assert certificates.host_matches(pki.cert_file.read_bytes(), "gw.example.com")
    assert certificates.host_matches(pki.cert_file.read_bytes(), "10.1.2.3")


def test_servers_sharing_a_data_directory_do_not_drop_each_other_s_names(tmp_path: Path) -> None:
    """Two servers in one data directory, each with its own --tls-host: the certificate names both,
    instead of each renewal taking the other's name away (and its clients' verification with it)."""
    files.ensure_gateway_pki(tmp_path, [*HOSTS, "one.example.com"])
    second = files.ensure_gateway_pki(tmp_path, [*HOSTS, "two.example.com"])
    assert second.issued_cert
    assert not files.ensure_gateway_pki(tmp_path, [*HOSTS, "one.example.com"]).issued_cert  # no flapping
    for host in ("one.example.com", "two.example.com", *HOSTS):
        assert certificates.host_matches(second.cert_file.read_bytes(), host), host


def test_a_cert_near_expiry_is_renewed_and_the_ca_kept(tmp_path: Path) -> None:
    pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    ca_before = pki.ca_file.read_bytes()
    ca = certificates.load_keypair(pki.ca_file, tmp_path / "tls" / "ca.key")
    short = certificates.issue_server_cert(ca, HOSTS, days=1)
    pki.cert_file.write_bytes(short.cert_pem)
    pki.key_file.write_bytes(short.key_pem)

    renewed = files.ensure_gateway_pki(tmp_path, HOSTS)
    assert renewed.issued_cert and not renewed.created_ca
    assert "renewing early" in renewed.reason
    assert renewed.ca_file.read_bytes() == ca_before
    new_cert = renewed.cert_file.read_bytes()
    assert new_cert != short.cert_pem
    assert certificates.cert_not_after(new_cert) > datetime.now(UTC) + timedelta(days=300)
    load(new_cert).verify_directly_issued_by(load(ca_before))
    # A 1-day certificate is fine when the caller renews only in its last hour.
    pki.cert_file.write_bytes(short.cert_pem)
    pki.key_file.write_bytes(short.key_pem)
    assert not files.ensure_gateway_pki(tmp_path, HOSTS, renew_before=timedelta(hours=1)).issued_cert


def test_renewal_certifies_the_same_key_and_replaces_only_the_certificate(tmp_path: Path) -> None:
    pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    key_before = pki.key_file.read_bytes()
    ca = certificates.load_keypair(pki.ca_file, tmp_path / "tls" / "ca.key")
    pki.cert_file.write_bytes(certificates.issue_server_cert(ca, HOSTS, days=1, key_pem=key_before).cert_pem)
    key_inode = pki.key_file.stat().st_ino

    renewed = files.ensure_gateway_pki(tmp_path, HOSTS)
    assert renewed.issued_cert and "renewing early" in renewed.reason
    assert pki.key_file.read_bytes() == key_before and pki.key_file.stat().st_ino == key_inode
    pair = certificates.load_keypair(pki.cert_file, pki.key_file)  # the new certificate matches the kept key
    assert pair.certificate.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300)
    # A new host: the same key certified for one more name.
    more = files.ensure_gateway_pki(tmp_path, [*HOSTS, "gw.example.test"])
    assert more.issued_cert and pki.key_file.read_bytes() == key_before
    assert certificates.host_matches(pki.cert_file.read_bytes(), "gw.example.test")


def test_the_renewer_renews_once_due_and_logs_a_failure_instead_of_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    renewer = reload.CertificateRenewer(tmp_path, HOSTS, interval=3600)
    first = renewer.check()
    assert first is not None and first.issued_cert  # the first check creates everything
    assert renewer.check() is not None and not renewer.check().issued_cert  # type: ignore[union-attr]
    ca = certificates.load_keypair(first.ca_file, tmp_path / "tls" / "ca.key")
    first.cert_file.write_bytes(
        certificates.issue_server_cert(ca, HOSTS, days=1, key_pem=first.key_file.read_bytes()).cert_pem)
    with caplog.at_level(logging.INFO, logger="bcs_middleware.pki"):
        assert renewer.check().issued_cert  # type: ignore[union-attr]
        (tmp_path / "tls" / "ca.key").write_bytes(b"not a key")
        assert renewer.check() is None
    assert "renewed the gateway certificate" in caplog.text
    assert "checking the gateway certificate failed (ConfigError)" in caplog.text
    with pytest.raises(ValueError):
        reload.CertificateRenewer(tmp_path, HOSTS, interval=0)


def _damage_foreign_ca(tls_dir: Path) -> None:
    foreign = certificates.issue_server_cert(certificates.generate_ca("foreign"), HOSTS)
    (tls_dir / "server.crt").write_bytes(foreign.cert_pem)
    (tls_dir / "server.key").write_bytes(foreign.key_pem)


def _damage_key_mismatch(tls_dir: Path) -> None:
    ca = certificates.load_keypair(tls_dir / "ca.crt", tls_dir / "ca.key")
    (tls_dir / "server.key").write_bytes(certificates.issue_server_cert(ca, HOSTS).key_pem)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(
            lambda d: (d / "server.crt").unlink(), "server certificate missing", id="cert-missing"
        ),
        pytest.param(
            lambda d: (d / "server.key").unlink(), "server certificate missing", id="key-missing"
        ),
        pytest.param(
            lambda d: (d / "server.crt").write_bytes(b"garbage"),
            "server certificate or key unreadable",
            id="cert-garbage",
        ),
        pytest.param(
            _damage_key_mismatch, "server certificate or key unreadable", id="key-mismatch"
        ),
        pytest.param(
            _damage_foreign_ca, "server certificate not signed by the current CA", id="foreign-ca"
        ),
    ],
)
def test_a_bad_server_cert_is_reissued(tmp_path: Path, damage: Any, reason: str) -> None:
    ca_before = files.ensure_gateway_pki(tmp_path, HOSTS).ca_file.read_bytes()
    damage(tmp_path / "tls")
    pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    assert pki.issued_cert and not pki.created_ca
    assert pki.reason == reason
    assert pki.ca_file.read_bytes() == ca_before
    certificates.load_keypair(pki.cert_file, pki.key_file)
    load(pki.cert_file.read_bytes()).verify_directly_issued_by(load(ca_before))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: (d / "ca.key").unlink(), id="ca-key-missing"),
        pytest.param(
            lambda d: (d / "ca.key").write_bytes(certificates.generate_ca("x").key_pem), id="ca-key-mismatch"
        ),
        pytest.param(lambda d: (d / "ca.crt").write_bytes(b"garbage"), id="ca-cert-garbage"),
    ],
)
def test_a_broken_ca_is_an_error_not_silently_replaced(tmp_path: Path, damage: Any) -> None:
    files.ensure_gateway_pki(tmp_path, HOSTS)
    damage(tmp_path / "tls")
    before = tls_files(tmp_path)
    with pytest.raises(ConfigError, match="remove both files") as info:
        files.ensure_gateway_pki(tmp_path, HOSTS)
    assert "PRIVATE KEY" not in str(info.value)
    assert tls_files(tmp_path) == before


def test_a_half_written_ca_without_cert_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "ca.key").write_bytes(b"left over from a crash")
    pki = files.ensure_gateway_pki(tmp_path, HOSTS)
    assert pki.created_ca
    certificates.load_keypair(pki.ca_file, tmp_path / "tls" / "ca.key")


def _ensure_in_child(data_dir: str) -> tuple[bytes, bytes, bool]:
    pki = files.ensure_gateway_pki(Path(data_dir), HOSTS)
    return pki.ca_file.read_bytes(), pki.cert_file.read_bytes(), pki.created_ca


def test_racing_processes_agree_on_one_ca(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        futures = [pool.submit(_ensure_in_child, str(tmp_path)) for _ in range(4)]
        results = [f.result(timeout=60) for f in futures]
    assert len({ca for ca, _, _ in results}) == 1
    assert len({cert for _, cert, _ in results}) == 1
    assert sum(created for _, _, created in results) == 1
    assert results[0][0] == (tmp_path / "tls" / "ca.crt").read_bytes()


# -- bundles -----------------------------------------------------------------------------


def test_gateway_bundle_files_and_overwrite_rule(tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = bundles.write_gateway_bundle(out, ["gw.example.com", "10.0.0.5"])
    assert {k: v.name for k, v in paths.items()} == {
        "ca_file": "ca.crt",
        "ca_key_file": "ca.key",
        "cert_file": "server.crt",
        "key_file": "server.key",
    }
    assert mode(out) == 0o700
    assert mode(paths["ca_key_file"]) == 0o600 and mode(paths["key_file"]) == 0o600
    pair = certificates.load_keypair(paths["cert_file"], paths["key_file"])
    pair.certificate.verify_directly_issued_by(load(paths["ca_file"].read_bytes()))
    assert certificates.cert_hosts(pair.cert_pem) == ["gw.example.com", "10.0.0.5"]

    before = paths["ca_file"].read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        bundles.write_gateway_bundle(out, ["gw.example.com"])
    assert paths["ca_file"].read_bytes() == before
    bundles.write_gateway_bundle(out, ["gw.example.com"], force=True)
    assert paths["ca_file"].read_bytes() != before


def test_gateway_bundle_does_not_chmod_an_existing_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    bundles.write_gateway_bundle(tmp_path, ["localhost"])
    assert mode(tmp_path) == 0o755


def test_gateway_bundle_rsa(tmp_path: Path) -> None:
    paths = bundles.write_gateway_bundle(tmp_path, ["localhost"], key_type="rsa", rsa_bits=2048)
    for name in ("ca_key_file", "key_file"):
        key = certificates.load_key(paths[name].read_bytes())
        assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048


def test_bad_arguments_leave_no_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        bundles.write_gateway_bundle(tmp_path / "a", ["localhost"], key_type="rsa", rsa_bits=1024)
    with pytest.raises(ValueError):
        bundles.write_gateway_bundle(tmp_path / "b", ["bad host"])
    assert list(tmp_path.iterdir()) == []


def test_service_bundle_names_the_service_and_gives_the_ca_bundle(tmp_path: Path) -> None:
    bundle = bundles.write_service_bundle(
        tmp_path, "sidecar-injector", "bcs-system", extra_hosts=["127.0.0.1"]
    )
    assert bundle.hosts == (
        "sidecar-injector.bcs-system",
        "sidecar-injector.bcs-system.svc",
        "sidecar-injector.bcs-system.svc.cluster.local",
        "127.0.0.1",
    )
    assert certificates.cert_hosts(bundle.cert_file.read_bytes()) == list(bundle.hosts)
    assert base64.b64decode(bundle.ca_bundle_b64) == bundle.ca_file.read_bytes()
    assert mode(bundle.key_file) == 0o600 and mode(bundle.ca_key_file) == 0o600
    load(bundle.cert_file.read_bytes()).verify_directly_issued_by(load(bundle.ca_file.read_bytes()))


@pytest.mark.parametrize(
    ("service", "namespace"),
    [
        pytest.param("Injector", "default", id="uppercase-service"),
        pytest.param("1injector", "default", id="service-starts-with-digit"),
        pytest.param("injector", "bad.ns", id="dotted-namespace"),
        pytest.param("injector", "", id="empty-namespace"),
    ],
)
def test_service_bundle_refuses_invalid_kubernetes_names(
    tmp_path: Path, service: str, namespace: str
) -> None:
    with pytest.raises(ValueError):
        bundles.write_service_bundle(tmp_path / "out", service, namespace)
    assert not (tmp_path / "out").exists()


def test_client_bundle_signed_by_an_existing_ca(tmp_path: Path) -> None:
    paths = bundles.write_gateway_bundle(tmp_path / "ca", ["localhost"])
    client = bundles.write_client_bundle(tmp_path / "client", tmp_path / "ca", "kube-agent")
    pair = certificates.load_keypair(client["cert_file"], client["key_file"])
    pair.certificate.verify_directly_issued_by(load(paths["ca_file"].read_bytes()))
    assert mode(client["key_file"]) == 0o600


# -- a real TLS handshake ----------------------------------------------------------------


class OneShotTLSServer:
    """Accept connections on loopback, handshake, send ``hello``; bounded in time."""

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.context = context
        self.sock = socket.create_server((host, 0), family=family)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.peer_certs: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls_conn:
                    self.peer_certs.append(tls_conn.getpeercert() or {})
                    tls_conn.sendall(b"hello")
            except (ssl.SSLError, OSError):
                conn.close()  # the client refused us: expected in the negative cases

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@contextlib.contextmanager
def tls_server(
    cert_file: Path, key_file: Path, host: str = "127.0.0.1", client_ca: Path | None = None
) -> Iterator[OneShotTLSServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    server = OneShotTLSServer(context, host)
    try:
        yield server
    finally:
        server.close()


def hello(port: int, host: str, server_hostname: str, context: ssl.SSLContext) -> bytes:
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as conn,
    ):
        return conn.recv(5)


@pytest.fixture(scope="module")
def gateway_pki(tmp_path_factory: pytest.TempPathFactory) -> files.GatewayPKI:
    return files.ensure_gateway_pki(tmp_path_factory.mktemp("data"), HOSTS)


@pytest.mark.parametrize(
    ("host", "server_hostname"),
    [
        pytest.param("127.0.0.1", "localhost", id="localhost"),
        pytest.param("127.0.0.1", "127.0.0.1", id="ipv4-san"),
        pytest.param("::1", "::1", id="ipv6-san"),
    ],
)
def test_tls_round_trip_verifies_against_the_generated_ca(
    gateway_pki: files.GatewayPKI, host: str, server_hostname: str
) -> None:
    client = ssl.create_default_context(cafile=str(gateway_pki.ca_file))
    with tls_server(gateway_pki.cert_file, gateway_pki.key_file, host) as server:
        assert hello(server.port, host, server_hostname, client) == b"hello"


@pytest.mark.parametrize(
    ("make_context", "server_hostname", "message"),
    [
        pytest.param(
            ssl.create_default_context, "localhost", "unable to get local issuer", id="system-cas"
        ),
        pytest.param(
            lambda: ssl.create_default_context(cadata=certificates.generate_ca("other").cert_pem.decode()),
            "localhost",
            "unable to get local issuer",
            id="other-ca",
        ),
        pytest.param(None, "gw.example.com", "Hostname mismatch", id="name-not-in-cert"),
    ],
)
def test_tls_round_trip_fails_without_the_right_ca_or_name(
    gateway_pki: files.GatewayPKI, make_context: Any, server_hostname: str, message: str
) -> None:
    context = ssl.create_default_context(cafile=str(gateway_pki.ca_file)) if make_context is None else make_context()
    with (
        tls_server(gateway_pki.cert_file, gateway_pki.key_file) as server,
        pytest.raises(ssl.SSLCertVerificationError, match=message),
    ):
        hello(server.port, "127.0.0.1", server_hostname, context)


def test_client_certificate_is_accepted_by_a_server_trusting_the_ca(tmp_path: Path) -> None:
    paths = bundles.write_gateway_bundle(tmp_path / "gw", ["localhost"])
    client = bundles.write_client_bundle(
        tmp_path / "agent", tmp_path / "gw", "kube-agent", organizations=["clusters"]
    )
    context = ssl.create_default_context(cafile=str(paths["ca_file"]))
    context.load_cert_chain(client["cert_file"], client["key_file"])
    with tls_server(paths["cert_file"], paths["key_file"], client_ca=paths["ca_file"]) as server:
        assert hello(server.port, "127.0.0.1", "localhost", context) == b"hello"
    subject = dict(item[0] for item in server.peer_certs[0]["subject"])
    assert subject == {"organizationName": "clusters", "commonName": "kube-agent"}
