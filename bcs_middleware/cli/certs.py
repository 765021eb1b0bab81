"""``bcs-middleware certs``: certificates for a production gateway, a webhook, a machine caller.

Three modes, exactly one per call::

    bcs-middleware certs --gateway --host gw.example.com,10.0.0.5 --out /etc/bcs/tls
    bcs-middleware certs --service sidecar-injector --namespace bcs-system --out ./certs
    bcs-middleware certs --client kube-agent --org clusters --ca-dir /etc/bcs/tls --out ./agent

``--gateway`` and ``--service`` write a new CA and a server certificate
(``ca.crt ca.key server.crt server.key``) and print how to use them: the
``serve`` options, or the ``caBundle`` value of a webhook definition.
``--client`` signs ``client.crt client.key`` with an existing CA. Existing
files are never overwritten without ``--force``. Exit code 0 on success, 2 on
a usage error or a refused write.

The building is done by :mod:`bcs_middleware.pki` (certificates, files, reload, bundles); this module only parses
and prints.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..pki import bundles, certificates

__all__ = ["configure_parser", "run"]

PROG = "bcs-middleware certs"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``certs`` options to ``parser`` (the sub-parser the main CLI made)."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--gateway",
        action="store_true",
        help="a CA and an HTTPS certificate for the gateway (needs --host)",
    )
    mode.add_argument(
        "--service",
        metavar="NAME",
        help="a CA and a certificate for the Kubernetes Service NAME (needs --namespace), "
        "e.g. an admission webhook",
    )
    mode.add_argument(
        "--client",
        metavar="NAME",
        help="a client certificate with subject CN=NAME, signed by the CA in --ca-dir",
    )
    parser.add_argument(
        "--host",
        metavar="NAME[,NAME...]",
        action="append",
        default=[],
        help="host name or IP address the certificate must name (repeatable, comma-separated)",
    )
    parser.add_argument("--namespace", metavar="NS", help="namespace of the --service")
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write to")
    parser.add_argument(
        "--key-type", choices=("ecdsa", "rsa"), default="ecdsa", help="default: ecdsa (P-256)"
    )
    parser.add_argument(
        "--rsa-bits",
        type=int,
        default=3072,
        metavar="N",
        help=f"RSA key size, at least {certificates.MIN_RSA_BITS} (default: 3072)",
    )
    parser.add_argument(
        "--ca-dir", metavar="DIR", help="with --client: directory holding ca.crt and ca.key"
    )
    parser.add_argument(
        "--org",
        action="append",
        default=[],
        metavar="O",
        help="with --client: an Organization (group) in the subject (repeatable)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing files")


def _hosts(values: Sequence[str]) -> list[str]:
    return [host.strip() for value in values for host in value.split(",") if host.strip()]


def _fail(message: str) -> int:
    # Same shape and exit code as argparse's own usage errors.
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _q(path: Path) -> str:
    return shlex.quote(str(path))


def _gateway(args: argparse.Namespace, out: Path) -> int:
    hosts = _hosts(args.host)
    if not hosts:
        return _fail("--gateway needs --host NAME[,NAME...] (every name clients will use)")
    paths = bundles.write_gateway_bundle(
        out, hosts, key_type=args.key_type, rsa_bits=args.rsa_bits, force=args.force
    )
    cert_pem = paths["cert_file"].read_bytes()
    print(f"Wrote {', '.join(_q(p) for p in paths.values())}")
    print(f"Server certificate names: {', '.join(certificates.cert_hosts(cert_pem))}")
    print(f"Valid until: {certificates.cert_not_after(cert_pem):%Y-%m-%d %H:%M} UTC")
    print("Serve with:")
    print(
        f"  bcs-middleware serve --certfile {_q(paths['cert_file'])} "
        f"--keyfile {_q(paths['key_file'])} --ca-file {_q(paths['ca_file'])}"
    )
    print(
        f"Clients trust {_q(paths['ca_file'])} (curl --cacert, kubeconfig certificate-authority)."
    )
    print(f"Keep {_q(paths['ca_key_file'])} offline: it can sign certificates clients will trust.")
    return 0


def _service(args: argparse.Namespace, out: Path) -> int:
    if not args.namespace:
        return _fail("--service needs --namespace NS")
    bundle = bundles.write_service_bundle(
        out,
        args.service,
        args.namespace,
        extra_hosts=_hosts(args.host),
        key_type=args.key_type,
        rsa_bits=args.rsa_bits,
        force=args.force,
    )
    files = (bundle.ca_file, bundle.ca_key_file, bundle.cert_file, bundle.key_file)
    print(f"Wrote {', '.join(_q(p) for p in files)}")
    print(f"Server certificate names: {', '.join(bundle.hosts)}")
    print(
        f"Serve the webhook with {_q(bundle.cert_file)} and {_q(bundle.key_file)}; "
        "put this in the webhook definition's clientConfig:"
    )
    print(f"caBundle: {bundle.ca_bundle_b64}")
    return 0


def _client(args: argparse.Namespace, out: Path) -> int:
    if not args.ca_dir:
        return _fail("--client needs --ca-dir DIR (holding ca.crt and ca.key)")
    paths = bundles.write_client_bundle(
        out, Path(args.ca_dir), args.client, organizations=args.org, force=args.force
    )
    print(f"Wrote {_q(paths['cert_file'])}, {_q(paths['key_file'])}")
    subject = certificates.load_keypair(paths["cert_file"], paths["key_file"]).certificate.subject
    print(f"Subject: {subject.rfc4514_string()}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``certs`` command; returns the exit code."""
    out = Path(args.out).absolute()
    try:
        if args.gateway:
            return _gateway(args, out)
        if args.service is not None:
            return _service(args, out)
        return _client(args, out)
    except FileExistsError as exc:
        return _fail(str(exc).replace("use force", "use --force"))
    except (ValueError, OSError) as exc:
        # ValueError: a bad host, name or key size; OSError: an unwritable directory or a
        # missing CA file. Neither carries key material.
        return _fail(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m bcs_middleware.cli.certs``), for tests and debugging."""
    parser = argparse.ArgumentParser(prog=PROG, description="Write TLS certificates.")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
