"""The only place the ``bcs.*`` WSGI environ keys are spelled.

Layers talk to each other through these keys and nothing else. Each value is a
frozen dataclass so a layer further down cannot change what an earlier one decided.

========================  ==================================================
key                       value
========================  ==================================================
``bcs.user``              :class:`User` — the authenticated principal
``bcs.agent``             :class:`ClusterAgent` — a cluster's register token
``bcs.cluster``           :class:`Cluster` — the cluster the request targets
``bcs.upstream``          :class:`Upstream` — where the proxy sends it
``bcs.admission``         :class:`AdmissionResult` — what admission did
``bcs.request_id``        ``str`` — the request id (accepted or generated)
``bcs.error_style``       ``"json"``, ``"kubernetes"`` or ``"bcs"`` — how errors render
``bcs.upgrade``           ``str`` — the upgrade protocol, ``""`` for none
                          (:mod:`bcs_middleware.core.http` decides)
``bcs.facts``             :class:`~bcs_middleware.core.facts.RequestFacts` — the
                          request classified once: route, cluster, API path, the
                          Kubernetes ``RequestInfo``, the upgrade
                          (:func:`bcs_middleware.core.facts.of` decides)
``bcs.document``          :class:`Document` — the request body as decoded for its
                          receiver and admitted (``wsgi.input`` holds its encoding)
``bcs.before_forward``    ``Callable[[], None]`` — what must hold before anything is
                          sent upstream (:func:`before_forward`): the audit layer's
                          ``blocking-strict`` ``RequestReceived`` delivery
========================  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .impersonation import AUTHENTICATED, Impersonation

USER = "bcs.user"
AGENT = "bcs.agent"
CLUSTER = "bcs.cluster"
UPSTREAM = "bcs.upstream"
ADMISSION = "bcs.admission"
REQUEST_ID = "bcs.request_id"
ERROR_STYLE = "bcs.error_style"
UPGRADE = "bcs.upgrade"
FACTS = "bcs.facts"
DOCUMENT = "bcs.document"
#: An exec/attach session as it ended (``recording.catalog.SessionInfo``), set by the session
#: recording layer when the stream closes, read by the audit layer for the session's event.
SESSION = "bcs.session"
#: Called by the proxy right before it sends anything upstream; raising a BCSError refuses the
#: request with nothing sent (the audit layer's blocking-strict RequestReceived delivery).
BEFORE_FORWARD = "bcs.before_forward"

ErrorStyle = Literal["json", "kubernetes", "bcs"]
ClusterType = Literal["k8s", "mesos"]


#: How a user proved who they are (``User.authenticated_by``); ``anonymous``: they did not, and the
#: authentication configuration lets such a request through as :data:`ANONYMOUS_USER`.
AuthMethod = Literal["token", "certificate", "oidc", "anonymous"]
#: ``User.id`` of a user the gateway keeps no record of (one signed in through an identity
#: provider): record ids start at 1, so no stored permission or token ever names it.
NO_RECORD = 0


@dataclass(frozen=True)
class User:
    """A gateway user, as the token auth layer found it.

    :param id: the user's record; :data:`NO_RECORD` for a user an identity provider vouches for.
    :param uid: the identity provider's stable id for the user (sent as ``Impersonate-Uid``).
    :param extra: ``(key, values)`` pairs the identity provider's claims map to
        (sent as ``Impersonate-Extra-{key}``).
    :param authenticated_by: a gateway token, a client certificate or an OIDC token.
    :param expires_at: when the credential stops being valid (seconds since the epoch), if it does.
    """

    id: int
    name: str
    is_superuser: bool = False
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    authenticated_by: AuthMethod = "token"
    expires_at: float | None = None

    @property
    def anonymous(self) -> bool:
        return self.authenticated_by == "anonymous"

    @property
    def kubernetes_groups(self) -> tuple[str, ...]:
        """The groups Kubernetes sees this user in: kube-apiserver adds ``system:authenticated`` to
        every authenticated user and never to ``system:anonymous`` (``impersonation.go`` adds
        ``system:unauthenticated`` to an impersonated anonymous user instead)."""
        return self.groups if self.anonymous else (AUTHENTICATED, *self.groups)


#: kube-apiserver's anonymous user and its one group (``k8s.io/apiserver/pkg/authentication/user``:
#: ``Anonymous``, ``AllUnauthenticated``).
ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
#: The user a request without credentials is, where the authentication configuration enables
#: ``anonymous`` (:mod:`bcs_middleware.authn.anonymous`): never a superuser, no record.
ANONYMOUS_USER = User(NO_RECORD, ANONYMOUS, groups=(UNAUTHENTICATED,), authenticated_by="anonymous")


def kubernetes_identity(user: User | None) -> tuple[str, tuple[str, ...]]:
    """The name and groups Kubernetes sees for ``user`` (``None``: a request nobody authenticated)."""
    user = user or ANONYMOUS_USER
    return user.name, user.kubernetes_groups


@dataclass(frozen=True)
class ClusterAgent:
    """A caller holding a cluster's register token (the kube-agent).

    Deliberately not a :class:`User`: it may only report its own cluster's
    credentials, and every other route sees the request as anonymous.
    """

    cluster_id: str


@dataclass(frozen=True, slots=True)
class Cluster:
    id: str
    project_id: str
    cluster_type: ClusterType


@dataclass(frozen=True, slots=True)
class Upstream:
    """Everything the upstream proxy needs to forward one request.

    :param base_urls: ``scheme://host:port`` candidates, tried in order on
        connection errors (failover); the proxy never tries one twice.
    :param path: the path (already percent-encoded) to request upstream.
    :param query: the raw query string to send (no leading ``?``).
    :param ca_pem: PEM bundle the upstream certificate must chain to;
        ``None`` means the system trust store.
    :param server_name: the TLS server name to verify instead of the host in
        the URL (the source system always used ``kubernetes``).
    :param verify: ``False`` only when an operator explicitly turned checking off.
    :param bearer_token: credential presented upstream as ``Authorization``.
    :param impersonate: the identity the cluster is asked to act as; the proxy renders
        it as ``Impersonate-*`` headers (:func:`~bcs_middleware.core.impersonation.impersonation_headers`),
        ``None``: the credential's own identity.
    :param set_headers: other headers the proxy sets after dropping the client's
        ``Authorization`` and hop-by-hop headers.
    :param client_cert: ``(certfile, keyfile)`` to present, if any.
    :param name: a label for logs and metrics (never a credential).
    :param tunnel: the cluster id whose kube-agent tunnel carries the connection
        (its apiserver is dialled through that agent, not directly); ``None``: direct.
    """

    base_urls: tuple[str, ...]
    path: str = "/"
    query: str = ""
    ca_pem: str | None = None
    server_name: str | None = None
    verify: bool = True
    bearer_token: str | None = field(default=None, repr=False)
    set_headers: tuple[tuple[str, str], ...] = ()
    impersonate: Impersonation | None = None
    client_cert: tuple[str, str] | None = None
    name: str = ""
    tunnel: str | None = None


@dataclass(frozen=True)
class AdmissionResult:
    """What the admission layer did to one request (for logs and audit)."""

    webhooks: tuple[str, ...] = ()
    patched: bool = False
    warnings: tuple[str, ...] = ()
    audit_annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Document:
    """The request body as the admission layer decoded (for its receiver) and admitted it.

    ``wsgi.input`` then holds exactly its encoding; a later layer that needs the object
    (the driver's conversion) takes it from here instead of decoding the body again.
    """

    value: Any


def get_document(environ: dict[str, Any]) -> Document | None:
    document = environ.get(DOCUMENT)
    return document if isinstance(document, Document) else None


def get_user(environ: dict[str, Any]) -> User | None:
    user = environ.get(USER)
    return user if isinstance(user, User) else None


def get_agent(environ: dict[str, Any]) -> ClusterAgent | None:
    agent = environ.get(AGENT)
    return agent if isinstance(agent, ClusterAgent) else None


def get_cluster(environ: dict[str, Any]) -> Cluster | None:
    cluster = environ.get(CLUSTER)
    return cluster if isinstance(cluster, Cluster) else None


def get_upstream(environ: dict[str, Any]) -> Upstream | None:
    upstream = environ.get(UPSTREAM)
    return upstream if isinstance(upstream, Upstream) else None


def get_error_style(environ: dict[str, Any]) -> ErrorStyle:
    style = environ.get(ERROR_STYLE)
    return style if style == "kubernetes" or style == "bcs" else "json"


def before_forward(environ: dict[str, Any]) -> None:
    """Run what must hold before the request leaves for its upstream (``bcs.before_forward``,
    set by an outer layer); its BCSError refuses the request, with nothing sent."""
    hook = environ.get(BEFORE_FORWARD)
    if hook is not None:
        hook()
