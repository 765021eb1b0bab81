"""The files of the ``bcs-middleware certs`` command: a production gateway's CA and certificate,
an admission webhook Service's, a machine caller's client certificate.

Each writer validates its input before touching the disk, creates a missing output directory
0700, and refuses to overwrite a file unless told to (``force``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .certificates import (
    KeyType,
    check_key_args,
    general_name_text,
    general_names,
    generate_ca,
    issue_client_cert,
    issue_server_cert,
    load_keypair,
)
from .files import CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE, write_pair

# Kubernetes: a Service name is a DNS-1035 label, a namespace a DNS-1123 label.
_K8S_SERVICE = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_K8S_NAMESPACE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


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
    names = general_names(hosts)  # validate before touching the disk
    check_key_args(key_type, rsa_bits)
    _prepare_out_dir(out_dir, list(paths.values()), force)
    ca = generate_ca(
        f"bcs-middleware gateway CA {general_name_text(names[0])}",
        key_type=key_type,
        rsa_bits=rsa_bits,
    )
    server = issue_server_cert(ca, hosts, key_type=key_type, rsa_bits=rsa_bits)
    write_pair(ca, paths["ca_file"], paths["ca_key_file"])
    write_pair(server, paths["cert_file"], paths["key_file"])
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
    names = general_names(hosts)
    check_key_args(key_type, rsa_bits)
    ca_file, ca_key_file = out_dir / CA_FILE, out_dir / CA_KEY_FILE
    cert_file, key_file = out_dir / CERT_FILE, out_dir / KEY_FILE
    _prepare_out_dir(out_dir, [ca_file, ca_key_file, cert_file, key_file], force)
    ca = generate_ca(
        f"bcs-middleware webhook CA {service}.{namespace}", key_type=key_type, rsa_bits=rsa_bits
    )
    server = issue_server_cert(ca, hosts, key_type=key_type, rsa_bits=rsa_bits)
    write_pair(ca, ca_file, ca_key_file)
    write_pair(server, cert_file, key_file)
    return ServiceBundle(
        ca_file=ca_file,
        ca_key_file=ca_key_file,
        cert_file=cert_file,
        key_file=key_file,
        ca_bundle_b64=base64.b64encode(ca.cert_pem).decode("ascii"),
        hosts=tuple(general_name_text(name) for name in names),
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
    write_pair(client, paths["cert_file"], paths["key_file"])
    return paths
