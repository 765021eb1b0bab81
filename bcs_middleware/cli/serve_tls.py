"""``bcs-middleware serve``'s TLS: the operator's certificate checked, or the data directory's
generated CA and certificate (never a second CA beside one the database records), and the
optional client CA — resolved into gunicorn settings once, before anything is bound.
"""

from __future__ import annotations

import argparse
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError
from .serve_options import ServerOptions, bind_is_loopback

if TYPE_CHECKING:
    from ..pki.files import GatewayPKI
    from ..pki.reload import CertificateRenewer

log = logging.getLogger("bcs_middleware.cli.main")


@dataclass
class ServeTLS:
    """How ``serve`` speaks to its clients."""

    scheme: str = "https"
    #: gunicorn's TLS settings (certfile, keyfile, ca_certs, cert_reqs)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the CA handed to clients (kubeconfigs, client_credentials), if known
    ca_file: str | None = None
    #: the certificate the management API describes
    cert_for_api: Path | None = None
    #: the generated CA and certificate, and what keeps them fresh while serving
    pki: GatewayPKI | None = None
    renewer: CertificateRenewer | None = None


def resolve_tls(args: argparse.Namespace, opts: ServerOptions, *, role: str, app_conf: dict[str, str],
                data_dir: Path) -> ServeTLS:
    """The TLS ``serve`` runs with: plain HTTP (``--insecure-http``, logged), the operator's
    certificate, or the data directory's generated one; then the client CA."""
    tls = ServeTLS(ca_file=opts.ca_file)
    if args.insecure_http:
        tls.scheme = "http"
        log.warning(
            "serving plain HTTP (--insecure-http): kubectl will not send bearer tokens to an http:// "
            "server, so kubectl cannot be used through this gateway%s",
            "" if bind_is_loopback(opts.bind)
            else "; and user tokens and cluster credentials cross the network in clear text",
        )
    elif opts.certfile and opts.keyfile:
        check_certificate(opts.certfile, opts.keyfile)
        tls.settings.update(certfile=str(opts.certfile), keyfile=str(opts.keyfile))
        tls.cert_for_api = Path(opts.certfile)
        if not opts.ca_file:
            log.warning("no --ca-file: client_credentials and kubeconfigs will not carry a CA")
    else:
        _generate(tls, args, role=role, app_conf=app_conf, data_dir=data_dir)
    if args.client_ca_file:
        check_client_ca(args.client_ca_file)
        # OPTIONAL: token clients keep working; a certificate that is presented must verify.
        tls.settings.update(ca_certs=str(Path(args.client_ca_file).absolute()), cert_reqs=ssl.CERT_OPTIONAL)
    return tls


def _generate(tls: ServeTLS, args: argparse.Namespace, *, role: str, app_conf: dict[str, str],
              data_dir: Path) -> None:
    from ..pki.files import default_gateway_hosts
    from ..pki.reload import CertificateRenewer

    hosts = default_gateway_hosts() + [h for spec in args.tls_host for h in spec.split(",") if h]
    if role == "gateway":
        database_url = app_conf.get("database_url") or None if app_conf else args.database_url
        app_data = Path(app_conf["data_dir"]).absolute() if app_conf.get("data_dir") else data_dir
        refuse_a_second_ca(database_url, app_data, data_dir / "tls")
    pki = tls.pki = generated_pki(data_dir, hosts)
    tls.renewer = CertificateRenewer(data_dir, hosts, interval=args.tls_check_interval)
    tls.settings.update(certfile=str(pki.cert_file), keyfile=str(pki.key_file))
    tls.ca_file, tls.cert_for_api = str(pki.ca_file), pki.cert_file


def check_certificate(certfile: str, keyfile: str) -> None:
    """The certificate and key load as gunicorn will load them (a clear error now, not in every worker)."""
    def no_passphrase() -> str:
        raise ConfigError(f"--keyfile {keyfile} is encrypted: serve needs an unencrypted key (mode 0600)")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile, password=no_passphrase)
    except ssl.SSLError as exc:
        raise ConfigError(f"--certfile {certfile} / --keyfile {keyfile}: {exc.reason or exc} (not a PEM "
                          "certificate and its private key?)") from None
    except OSError as exc:
        raise ConfigError(f"--certfile {certfile} / --keyfile {keyfile}: {exc.strerror or exc}") from None


def check_client_ca(path: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--client-ca-file {path}: {getattr(exc, 'strerror', None) or exc}") from None


def refuse_a_second_ca(database_url: str | None, data_dir: Path, tls_dir: Path) -> None:
    """Before making a CA in ``tls_dir``: refuse when the database records the gateways' CA already —
    this instance must hand out that one, not mint its own."""
    from ..compose.instance_checks import recorded_ca
    from ..store.crypto import SecretBox
    from ..store.database import Database, sqlite_url
    from ..store.sql import SQLStore

    if (tls_dir / "ca.crt").exists():
        return
    store = SQLStore(Database(database_url or sqlite_url(data_dir), secrets=SecretBox([])))
    try:
        store.db.migrate()
        recorded = recorded_ca(store)
    finally:
        store.db.dispose()
    if recorded is not None:
        raise ConfigError(
            f"the database {store.db.display_url} records the CA the gateways hand to clients ({recorded}), and "
            f"{tls_dir} has no CA: this instance would make a CA of its own, which no client trusts. Copy ca.crt "
            f"and ca.key from another instance's DATA_DIR/tls/ into {tls_dir}/ (mode 0600 for the key), or serve "
            "--certfile/--keyfile signed by that CA with --ca-file"
        )


def generated_pki(data_dir: Path, hosts: list[str]) -> GatewayPKI:
    """The data directory's CA and server certificate (made or renewed as needed)."""
    from ..pki.files import ensure_gateway_pki

    try:
        return ensure_gateway_pki(data_dir, hosts)
    except ValueError as exc:  # a --tls-host that is no host name or address
        raise ConfigError(f"--tls-host: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{data_dir / 'tls'}: {exc.strerror or exc}") from None
