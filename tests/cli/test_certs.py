"""``bcs-middleware certs`` run in-process through argparse; its files checked with cryptography."""

from __future__ import annotations

import argparse
import base64
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bcs_middleware.cli import certs as cli_certs
from bcs_middleware.pki import certificates


def certs(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bcs-middleware certs")
    cli_certs.configure_parser(parser)
    return cli_certs.run(parser.parse_args(argv))


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_gateway_writes_a_ca_and_cert_and_prints_the_serve_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    rc = certs(
        ["--gateway", "--host", "gw.example.com,10.0.0.5", "--host", "::1", "--out", str(out)]
    )
    assert rc == 0
    stdout = capsys.readouterr().out
    assert (
        f"bcs-middleware serve --certfile {out}/server.crt --keyfile {out}/server.key "
        f"--ca-file {out}/ca.crt"
    ) in stdout
    assert "Server certificate names: gw.example.com, 10.0.0.5, ::1" in stdout
    assert "PRIVATE KEY" not in stdout

    ca, cert = load(out / "ca.crt"), load(out / "server.crt")
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gw.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("::1"),
    ]
    key = certificates.load_keypair(out / "server.crt", out / "server.key")
    assert isinstance(certificates.load_key(key.key_pem), ec.EllipticCurvePrivateKey)
    for name in ("ca.key", "server.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600


def test_gateway_rsa(tmp_path: Path) -> None:
    argv = ["--gateway", "--host", "gw", "--key-type", "rsa", "--rsa-bits", "2048"]
    assert certs([*argv, "--out", str(tmp_path)]) == 0
    key = certificates.load_key((tmp_path / "server.key").read_bytes())
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048


def test_gateway_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert certs(["--gateway", "--host", "gw", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "ca.key").read_bytes()
    assert certs(["--gateway", "--host", "gw", "--out", str(tmp_path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "ca.key").read_bytes() == before
    assert certs(["--gateway", "--host", "gw", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.key").read_bytes() != before


def test_service_prints_the_ca_bundle_and_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--service", "sidecar-injector", "--namespace", "bcs-system", "--out", str(tmp_path)]
    assert certs([*argv, "--host", "127.0.0.1"]) == 0
    stdout = capsys.readouterr().out
    bundle_lines = [line for line in stdout.splitlines() if line.startswith("caBundle: ")]
    assert len(bundle_lines) == 1
    ca_bundle = bundle_lines[0].removeprefix("caBundle: ")
    assert base64.b64decode(ca_bundle, validate=True) == (tmp_path / "ca.crt").read_bytes()
    names = [
        "sidecar-injector.bcs-system",
        "sidecar-injector.bcs-system.svc",
        "sidecar-injector.bcs-system.svc.cluster.local",
        "127.0.0.1",
    ]
    assert f"Server certificate names: {', '.join(names)}" in stdout
    assert certificates.cert_hosts((tmp_path / "server.crt").read_bytes()) == names
    load(tmp_path / "server.crt").verify_directly_issued_by(load(tmp_path / "ca.crt"))
    assert "PRIVATE KEY" not in stdout


def test_client_signs_with_an_existing_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert certs(["--gateway", "--host", "gw", "--out", str(tmp_path / "ca")]) == 0
    argv = ["--client", "kube-agent", "--org", "clusters", "--ca-dir", str(tmp_path / "ca")]
    assert certs([*argv, "--out", str(tmp_path / "agent")]) == 0
    assert "Subject: CN=kube-agent,O=clusters" in capsys.readouterr().out
    load(tmp_path / "agent" / "client.crt").verify_directly_issued_by(
        load(tmp_path / "ca" / "ca.crt")
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--gateway"], "--gateway needs --host", id="gateway-without-host"),
        pytest.param(["--gateway", "--host", " , "], "--gateway needs --host", id="blank-hosts"),
        pytest.param(["--gateway", "--host", "bad host"], "not a valid host", id="bad-host"),
        pytest.param(
            ["--gateway", "--host", "gw", "--key-type", "rsa", "--rsa-bits", "1024"],
            "at least 2048 bits",
            id="rsa-1024",
        ),
        pytest.param(["--service", "inj"], "--service needs --namespace", id="service-without-ns"),
        pytest.param(
            ["--service", "Inj", "--namespace", "ns"],
            "not a valid Kubernetes service",
            id="bad-svc",
        ),
        pytest.param(["--client", "agent"], "--client needs --ca-dir", id="client-without-ca"),
        pytest.param(
            ["--client", "agent", "--ca-dir", "/nonexistent"], "No such file", id="client-no-ca"
        ),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert certs([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcs-middleware certs: error: ")
    assert message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--out", "x"], "one of the arguments --gateway --service --client", id="none"
        ),
        pytest.param(["--gateway", "--service", "s", "--out", "x"], "not allowed", id="two"),
        pytest.param(["--gateway", "--host", "gw"], "--out", id="no-out"),
        pytest.param(
            ["--gateway", "--out", "x", "--key-type", "dsa"], "invalid choice", id="key-type"
        ),
    ],
)
def test_argparse_rejects_bad_combinations(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        certs(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_module_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_certs.main(["--gateway", "--host", "localhost", "--out", str(tmp_path)]) == 0
    assert "bcs-middleware serve --certfile" in capsys.readouterr().out
