"""Identity-provider JWTs beside gateway tokens, in the one token auth layer.

:class:`CredentialKinds` puts both kinds of bearer token behind the one
:class:`~.auth.Authenticator` that :class:`~.auth.TokenAuthMiddleware` asks;
:class:`JWTAuthenticator` turns a verified token's identity
(:mod:`bcs_middleware.authn`) into the gateway's :class:`~bcs_middleware.core.environ.User`.
A module of its own so that a gateway without an ``authentication_config`` never loads the
JWT and CEL libraries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..admission.outcome import warning_headers
from ..authn.anonymous import AnonymousAuth
from ..authn.config import load_configuration
from ..authn.service import JWTAuthenticators, Refusal, looks_like_jwt
from ..authn.settings import IdentitySettings
from ..authn.verify import Identity
from ..core import environ as env
from ..core.cache import Cache
from ..core.errors import BEARER_CHALLENGE, ConfigError, Unauthorized
from ..outbound.transport import Transport, default_transport

#: What :class:`~.auth.TokenAuthMiddleware` accepts from an authenticator (its ``Principal``).
Principal = env.User | env.ClusterAgent


class Authenticator(Protocol):
    """:class:`~.auth.Authenticator`, restated: this module is imported by that one's factory."""

    def authenticate(self, token: str) -> Principal | None: ...

__all__ = ["CredentialKinds", "JWTAuthenticator", "SignIn", "sign_in"]


class JWTAuthenticator:
    """Bearer JWTs of the configured identity providers, as gateway users (see :mod:`bcs_middleware.authn`).

    A verified token's user carries the mapped name, uid, groups and extra, is a superuser
    when one of its groups is in ``superuser_groups``, and has no record in the store
    (:data:`~bcs_middleware.core.environ.NO_RECORD`): what it may do comes from its groups
    and name, through the permission subscription and each cluster's RBAC. The answer is
    cached until the token expires (:class:`~bcs_middleware.authn.service.JWTAuthenticators`);
    a refused token raises the 401 whose message says why.

    A token whose issuer's keys cannot be fetched (the provider is down or hangs) is a 401
    too, as kube-apiserver answers it (``oidc.go``: an authenticator whose verifier is not
    initialised returns ``oidc: authenticator not initialized``, a failed key fetch fails
    the verification; either is an authentication error, so the request is unauthorised).
    The message says the provider is unreachable and to try again, not to sign in again; it
    is also sent as a ``Warning`` header, which kubectl prints (its discovery drops a 401's
    Status message, and for a 503 it prints only "the server is currently unable to handle
    the request").
    """

    def __init__(self, jwts: JWTAuthenticators, *, superuser_groups: Iterable[str] = ()) -> None:
        self.jwts = jwts
        self.superuser_groups = frozenset(superuser_groups)
        self._users: Cache[Identity, env.User] = Cache(max_entries=10_000)

    def authenticate(self, token: str) -> Principal | None:
        answer = self.jwts.authenticate(token)
        if isinstance(answer, Refusal):
            # kubectl's discovery drops a 401 Status's message ("the server has asked for the
            # client to provide credentials") but prints every Warning header it receives: the
            # reason travels in both.
            warning = warning_headers([answer.reason.encode("ascii", "backslashreplace").decode()])
            raise Unauthorized(answer.reason, headers=[BEARER_CHALLENGE, *warning])
        return self._users.load(answer, self._user)

    def _user(self, identity: Identity) -> env.User:
        return env.User(
            env.NO_RECORD, identity.username, not self.superuser_groups.isdisjoint(identity.groups),
            identity.groups, uid=identity.uid, extra=identity.extra, authenticated_by="oidc",
            expires_at=identity.expires_at,
        )


class CredentialKinds:
    """Gateway tokens and identity-provider JWTs behind one :class:`Authenticator`.

    Which kind a bearer token is gets decided once, by its shape
    (:func:`~bcs_middleware.authn.service.looks_like_jwt`): a JWT is never looked up as a
    gateway token and a gateway token never parsed as a JWT.
    """

    def __init__(self, tokens: Authenticator, jwts: Authenticator) -> None:
        self.tokens = tokens
        self.jwts = jwts

    def authenticate(self, token: str) -> Principal | None:
        return self.jwts.authenticate(token) if looks_like_jwt(token) else self.tokens.authenticate(token)


@dataclass(frozen=True)
class SignIn:
    """What the gateway's sign-in settings configure, read from the file once.

    :param authenticator: gateway tokens, and the identity providers' JWTs beside them (if any).
    :param anonymous: the file's ``anonymous`` (``None``: the file has none, or there is no file).
    """

    authenticator: Authenticator
    anonymous: AnonymousAuth | None = None


def sign_in(tokens: Authenticator, settings: IdentitySettings, transport: Transport | None = None) -> SignIn:
    """``tokens``, the identity providers ``settings`` configure beside them, and ``anonymous``.

    The configuration is read and validated here, at start: a bad file stops the server with
    every problem listed; so does a ``superuser_groups`` entry that every request without
    credentials would be in. Discovery and keys are fetched on first use, through ``transport``
    (default the process's).
    """
    unauthenticated = {env.ANONYMOUS, env.UNAUTHENTICATED}.intersection(settings.superuser_groups)
    if unauthenticated:
        raise ConfigError(f"superuser_groups: {sorted(unauthenticated)[0]!r} is what a request without "
                          "credentials is: it can never be a superuser group")
    if settings.authentication_config is None:
        if settings.superuser_groups:
            raise ConfigError("superuser_groups needs authentication_config (groups come from an identity provider)")
        return SignIn(tokens)
    configuration = load_configuration(settings.authentication_config)
    if not configuration.jwt:
        return SignIn(tokens, configuration.anonymous)
    jwts = JWTAuthenticator(JWTAuthenticators(configuration, transport or default_transport()),
                            superuser_groups=settings.superuser_groups)
    return SignIn(CredentialKinds(tokens, jwts), configuration.anonymous)
