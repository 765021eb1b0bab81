"""Client-certificate authentication for machine callers (the kube-agent, automation).

Configured explicitly: the server asks for a client certificate (gunicorn
``cert_reqs = CERT_OPTIONAL`` with ``ca_certs`` = the client CA — ``serve
--client-ca-file``), and :class:`ClientCertificateAuthenticator` maps the
*verified* certificate's subject to a principal:

* ``CN=kube-agent,O=BCS-K8S-001 -> cluster:BCS-K8S-001`` — the cluster's agent, which
  may report that cluster's credentials (like its register token);
* ``CN=deploy-bot -> user:deploy-bot`` — an existing gateway user.

Only subjects listed map to anything; a certificate the TLS layer did not verify
never reaches here (OpenSSL refuses the handshake). Bearer tokens keep working
beside certificates; a request carrying both is judged by its token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..core import environ as env
from ..core.errors import ConfigError

Principal = env.User | env.ClusterAgent

_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "emailAddress": "emailAddress",
}


def subject_text(peercert: Mapping[str, Any]) -> str:
    """``CN=x,O=y`` from :meth:`ssl.SSLSocket.getpeercert` (order as in the certificate)."""
    parts = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            parts.append(f"{_SHORT.get(key, key)}={value}")
    return ",".join(parts)


def _normal(subject: str) -> str:
    return ",".join(part.strip() for part in subject.split(",") if part.strip())


def parse_subject_map(text: str | Mapping[str, str]) -> dict[str, str]:
    """Lines ``SUBJECT -> user:NAME`` or ``SUBJECT -> cluster:ID`` → dict (the ini form)."""
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            subject, sep, target = line.partition("->")
            if not sep:
                raise ConfigError(f"client certificate map: expected 'SUBJECT -> user:NAME|cluster:ID', got {line!r}")
            items.append((subject, target))
    result = {}
    for subject, target in items:
        kind, _, name = target.strip().partition(":")
        if kind not in ("user", "cluster") or not name:
            raise ConfigError(f"client certificate map: {target.strip()!r} must be user:NAME or cluster:ID")
        result[_normal(subject)] = f"{kind}:{name}"
    return result


class ClientCertificateAuthenticator:
    """Map a verified client certificate's subject to a principal.

    :param subjects: normalised subject → ``user:NAME`` | ``cluster:ID``.
    :param find_user: the store's lookup by name (``SQLStore.find_user``).
    """

    def __init__(self, subjects: Mapping[str, str], find_user: Callable[[str], Any]) -> None:
        self.subjects = {_normal(k): v for k, v in subjects.items()}
        self.find_user = find_user

    def authenticate_peer(self, environ: Mapping[str, Any]) -> Principal | None:
        sock = environ.get("gunicorn.socket")
        getpeercert = getattr(sock, "getpeercert", None)
        if getpeercert is None:
            return None
        try:
            peercert = getpeercert()
        except (ValueError, OSError):
            return None
        if not peercert:
            return None  # no certificate presented (or not verified: then it is empty)
        target = self.subjects.get(subject_text(peercert))
        if target is None:
            return None
        kind, _, name = target.partition(":")
        if kind == "cluster":
            return env.ClusterAgent(name)
        user = self.find_user(name)
        if user is None:
            return None
        return env.User(user.id, user.name, user.is_superuser, authenticated_by="certificate")
