"""Bearer-token authentication as a WSGI layer.

:class:`TokenAuthMiddleware` reads ``Authorization: Bearer <token>``, asks an
:class:`Authenticator` who it belongs to, and puts the answer in the environ:

* a user token → ``bcs.user`` (:class:`~bcs_middleware.core.environ.User`);
* a cluster's register token → ``bcs.agent``
  (:class:`~bcs_middleware.core.environ.ClusterAgent`) — deliberately *not* a user,
  so every route except its own cluster's credentials report sees it as
  anonymous and refuses it.

Unknown, expired or revoked tokens get ``401`` with ``WWW-Authenticate: Bearer``;
a request without a token gets ``401`` unless its path is public, where it passes
through anonymously, or the authentication configuration's ``anonymous`` admits it
(:mod:`bcs_middleware.authn.anonymous`), where it is
:data:`~bcs_middleware.core.environ.ANONYMOUS_USER`. It works in front of any WSGI application.

Lookups go through a per-process cache (:class:`CachingAuthenticator`) so the
store stays off the hot path; a revoked token stops working everywhere within
the cache's ``ttl`` (default 5 s). Tokens are looked up by their SHA-256 digest
and compared in constant time; neither the token nor its digest is ever logged.

Example — protect any WSGI app with tokens kept in the gateway's database::

    from bcs_middleware.layers.auth import TokenAuthMiddleware, StoreAuthenticator
    app = TokenAuthMiddleware(app, authenticator=StoreAuthenticator(store),
                              public_paths=["/healthz"])

Reads ``HTTP_AUTHORIZATION``, ``PATH_INFO`` and, for a request without a token, the route
kind of ``bcs.facts`` (:func:`bcs_middleware.core.facts.of`); sets ``bcs.user`` or ``bcs.agent``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from ..authn.anonymous import AnonymousAuth
from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.cache import Cache
from ..core.errors import BCSError, ConfigError, ServiceUnavailable, Unauthorized
from ..core.routes import RouteKind
from ..store.crypto import digests_equal, token_digest
from ..telemetry.metrics import BATCH, TOKEN_CACHE

log = logging.getLogger(__name__)

Principal = env.User | env.ClusterAgent

#: pkg/kubeapiserver/options/authentication.go refuses the flag beside the file's field (its
#: message, less its typo); ``required`` is this layer's ``--anonymous-auth``.
ANONYMOUS_CONFLICT = ("required cannot be set when anonymous is configured in the authentication "
                      "configuration file (as kube-apiserver's --anonymous-auth flag)")


class Authenticator(Protocol):
    """Maps a bearer token to a principal, or ``None`` when it is not valid now."""

    def authenticate(self, token: str) -> Principal | None: ...


class PeerAuthenticator(Protocol):
    """Maps the verified client certificate of a request to a principal (or ``None``)."""

    def authenticate_peer(self, environ: Mapping[str, Any]) -> Principal | None: ...


class TokenStore(Protocol):
    """What :class:`StoreAuthenticator` needs from the store (``SQLStore`` has it)."""

    def authenticate(self, token: str) -> Any: ...

    def authenticate_register_token(self, token: str) -> str | None: ...

    def touch_token(self, token_id: int) -> None: ...


class StoreAuthenticator:
    """User tokens and register tokens kept in the gateway's store."""

    #: how stale ``last_used_at`` may get before a lookup refreshes it
    touch_interval = timedelta(seconds=60)

    def __init__(self, store: TokenStore, *, groups: Mapping[str, Iterable[str]] | None = None) -> None:
        self.store = store
        self.groups = {name: tuple(g) for name, g in (groups or {}).items()}

    def authenticate(self, token: str) -> Principal | None:
        found = self.store.authenticate(token)
        if found is not None:
            user, token_rec = found
            now = datetime.now(UTC)
            if token_rec.last_used_at is None or now - token_rec.last_used_at > self.touch_interval:
                try:
                    self.store.touch_token(token_rec.id)
                except ServiceUnavailable:
                    pass  # bookkeeping only: never fail a request over it
            return env.User(user.id, user.name, user.is_superuser, self.groups.get(user.name, ()))
        cluster_id = self.store.authenticate_register_token(token)
        if cluster_id is not None:
            return env.ClusterAgent(cluster_id)
        return None


@dataclass(frozen=True)
class StaticToken:
    digest: str
    user: env.User


class StaticAuthenticator:
    """Tokens from a file or from code: the in-memory implementation.

    Each entry holds only the SHA-256 digest of a token. The file format is one
    token per line: ``NAME SHA256_HEX [superuser] [group,group…]``; ``#`` comments.
    """

    def __init__(self, tokens: Iterable[StaticToken]) -> None:
        self.tokens = list(tokens)

    @classmethod
    def from_tokens(cls, tokens: Mapping[str, env.User]) -> StaticAuthenticator:
        return cls(StaticToken(token_digest(value), user) for value, user in tokens.items())

    @classmethod
    def from_file(cls, path: str | Path) -> StaticAuthenticator:
        entries = []
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) < 2 or len(fields[1]) != 64:
                raise ConfigError(f"{path}:{number}: expected 'NAME SHA256_HEX [superuser] [groups]'")
            flags = fields[2:]
            superuser = "superuser" in flags
            groups = tuple(g for f in flags if f != "superuser" for g in f.split(",") if g)
            user = env.User(id=number, name=fields[0], is_superuser=superuser, groups=groups)
            entries.append(StaticToken(fields[1].lower(), user))
        return cls(entries)

    def authenticate(self, token: str) -> Principal | None:
        digest = token_digest(token)
        found: env.User | None = None
        for entry in self.tokens:  # no early exit: the time taken says nothing
            if digests_equal(entry.digest, digest):
                found = entry.user
        return found


class CachingAuthenticator:
    """A per-process, size-bounded TTL cache in front of another authenticator.

    Negative answers are cached too, so a client hammering a bad token costs one
    store lookup per ``ttl``. Keys are token digests, never token values.
    """

    def __init__(self, inner: Authenticator, *, ttl: float = 5.0, max_entries: int = 10_000) -> None:
        self.inner = inner
        self.ttl = ttl
        self.max_entries = max_entries
        # The package's one cache policy for store answers: kept ``ttl`` after loading,
        # the oldest loaded dropped first when full; no lock on a hit.
        self._cache: Cache[str, Principal | None] = Cache(max_entries=max_entries, max_age=max(ttl, 0))

    def authenticate(self, token: str) -> Principal | None:
        if self.ttl <= 0:
            return self.inner.authenticate(token)
        missed = False

        def load(_key: str) -> Principal | None:
            nonlocal missed
            missed = True
            return self.inner.authenticate(token)

        principal = self._cache.load(token_digest(token), load)
        BATCH.inc(TOKEN_CACHE, "miss" if missed else "hit")
        return principal

    def clear(self) -> None:
        self._cache.clear()


def bearer_token(environ: Mapping[str, Any]) -> str | None:
    """The token of an ``Authorization: Bearer`` header; ``""`` when malformed."""
    header = environ.get("HTTP_AUTHORIZATION")
    if header is None:
        return None
    # The common shape, answered without splitting: "Bearer " and a token without
    # whitespace (every whitespace character but the space is unprintable).
    if header.startswith("Bearer "):
        token = header[7:]
        if token and " " not in token and token.isprintable():
            return token
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return ""
    return token


class TokenAuthMiddleware:
    """Authenticate bearer tokens; see the module docstring.

    :param app: the WSGI application to protect.
    :param authenticator: who a token belongs to (:class:`StoreAuthenticator`,
        :class:`StaticAuthenticator`, wrapped in :class:`CachingAuthenticator`).
    :param public_paths: path prefixes reachable without a token (``/healthz``).
        A prefix ending in ``/`` matches below it; otherwise it must match exactly
        or be followed by ``/``.
    :param required: ``False`` lets every unauthenticated request through as
        anonymous (the app decides); invalid tokens are still refused.
    :param peer_authenticator: for requests without a token, who the verified
        client certificate belongs to (see :mod:`.client_cert`); ``None``: tokens only.
    :param public_routes: route kinds (:mod:`bcs_middleware.core.routes`) whose
        requests may come without a token and pass through anonymously, the app
        authenticating them itself (``agent_report``: the Go kube-agent's report
        carries its register token in the body).
    :param anonymous: the authentication configuration's ``anonymous``: which requests
        without credentials are ``system:anonymous``; cannot be given with ``required=False``
        (kube-apiserver refuses ``--anonymous-auth`` beside the file's ``anonymous``).
    """

    def __init__(
        self,
        app: Any,
        *,
        authenticator: Authenticator,
        public_paths: Iterable[str] = ("/healthz", "/readyz"),
        required: bool = True,
        peer_authenticator: PeerAuthenticator | None = None,
        public_routes: Iterable[RouteKind] = (),
        anonymous: AnonymousAuth | None = None,
    ) -> None:
        if anonymous is not None and not required:
            raise ConfigError(ANONYMOUS_CONFLICT)
        self.app = app
        self.anonymous = anonymous if anonymous is not None and anonymous.enabled else None
        self.public_routes = frozenset(public_routes)
        self.authenticator = authenticator
        self.public_paths = tuple(public_paths)
        # "/healthz" is public as itself and below "/healthz/"; "/static/" below it only.
        self._public_exact = frozenset(p for p in self.public_paths if not p.endswith("/"))
        self._public_below = tuple(p if p.endswith("/") else p + "/" for p in self.public_paths)
        self.required = required
        self.peer_authenticator = peer_authenticator

    def is_public(self, path: str) -> bool:
        return path in self._public_exact or path.startswith(self._public_below)

    def _public_request(self, environ: dict[str, Any]) -> bool:
        return request_facts.of(environ).kind in self.public_routes

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # A principal is only ever what this layer decided, never something injected upstream of it.
        environ.pop(env.USER, None)
        environ.pop(env.AGENT, None)
        public = self.is_public(environ.get("PATH_INFO", ""))
        token = bearer_token(environ)
        if token is None:
            peer = self.peer_authenticator.authenticate_peer(environ) if self.peer_authenticator else None
            if peer is not None:
                environ[env.USER if isinstance(peer, env.User) else env.AGENT] = peer
                return self.app(environ, start_response)
            if public or not self.required or (self.public_routes and self._public_request(environ)):
                return self.app(environ, start_response)
            if self.anonymous is not None and self.anonymous.admits(
                environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", ""), request_facts.of(environ).kind
            ):
                environ[env.USER] = env.ANONYMOUS_USER
                return self.app(environ, start_response)
            return Unauthorized("missing bearer token")(environ, start_response)
        if token == "":
            if public:
                return self.app(environ, start_response)
            return Unauthorized("malformed Authorization header: expected 'Bearer <token>'")(
                environ, start_response
            )
        try:
            principal = self.authenticator.authenticate(token)
        except BCSError as exc:
            return exc(environ, start_response)
        if principal is None:
            if public:
                return self.app(environ, start_response)
            return Unauthorized("invalid, expired or revoked token")(environ, start_response)
        if isinstance(principal, env.User):
            environ[env.USER] = principal
        else:
            environ[env.AGENT] = principal
        return self.app(environ, start_response)


_OPTIONS: dict[str, conv.Converter] = {
    "authentication_config": conv.text,
    "superuser_groups": conv.aslist,
    "database_url": conv.text,
    "data_dir": conv.text,
    "secret_key": conv.text,
    "tokens_file": conv.text,
    "public_paths": conv.aslist,
    "required": conv.asbool,
    "cache_ttl": conv.seconds,
    "cache_size": conv.positive_int,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#token_auth``.

    Tokens come from the gateway's database — ``data_dir`` (the gateway's data
    directory) or ``database_url`` (with the same ``secret_key`` as the gateway) —
    or from a ``tokens_file`` of digests::

        [filter:token_auth]
        use = egg:bcs-middleware#token_auth
        database_url = postgresql://bcs@db/bcs
        public_paths = /healthz /static/
        cache_ttl = 5s
        # optional: identity-provider JWTs beside the gateway's tokens
        authentication_config = /etc/bcs/authentication-config.yaml
        superuser_groups = platform-admins

        [pipeline:main]
        pipeline = token_auth myapp
    """
    opts = conv.convert_options("filter:token_auth", local_conf, _OPTIONS)
    inner: Authenticator
    if opts.get("tokens_file"):
        inner = StaticAuthenticator.from_file(opts["tokens_file"])
    elif opts.get("database_url") or opts.get("data_dir"):
        inner = StoreAuthenticator(open_gateway_store(
            data_dir=opts.get("data_dir"), database_url=opts.get("database_url"), secret_key=opts.get("secret_key")
        ))
    else:
        raise ConfigError("[filter:token_auth] needs data_dir, database_url or tokens_file")
    authenticator: Authenticator = CachingAuthenticator(
        inner, ttl=opts.get("cache_ttl", 5.0), max_entries=opts.get("cache_size", 10_000)
    )
    anonymous: AnonymousAuth | None = None
    if opts.get("authentication_config") or opts.get("superuser_groups"):
        # Imported only when configured: the JWT and CEL libraries cost a worker seconds to load.
        from ..authn.settings import IdentitySettings
        from .jwt_auth import sign_in

        settings = IdentitySettings(
            Path(opts["authentication_config"]) if opts.get("authentication_config") else None,
            tuple(opts.get("superuser_groups", ())),
        )
        configured = sign_in(authenticator, settings)
        authenticator, anonymous = configured.authenticator, configured.anonymous
        if anonymous is not None and "required" in opts:
            raise ConfigError(f"[filter:token_auth] {ANONYMOUS_CONFLICT}")

    def make(app: Any) -> TokenAuthMiddleware:
        return TokenAuthMiddleware(
            app,
            authenticator=authenticator,
            public_paths=opts.get("public_paths", ("/healthz", "/readyz")),
            required=opts.get("required", True),
            anonymous=anonymous,
        )

    return make


def open_gateway_store(*, data_dir: str | Path | None = None, database_url: str | None = None,
                       secret_key: str | None = None) -> Any:
    """The gateway's store for token auth, refused at start when it is not there.

    A missing database would otherwise answer every token with 503.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from ..store.database import sqlite_url
    from ..store.sql import open_store

    url = database_url
    if url is None:
        if data_dir is None:
            raise ConfigError("token auth needs the gateway's data_dir or database_url")
        path = Path(data_dir)
        if not (path / "bcs.sqlite3").is_file():
            raise ConfigError(
                f"token auth: no gateway database in {path.absolute()}: start the gateway there once "
                "(bcs-middleware serve --data-dir ...) and issue tokens with its REST API"
            )
        url = sqlite_url(path)
    store = open_store(url, secret_key=secret_key, migrate=False)
    try:
        store.find_user("")
    except SQLAlchemyError:
        store.db.dispose()
        where = database_url or f"data_dir {data_dir}"
        raise ConfigError(f"token auth: {where} holds no gateway database (its tables are missing): "
                          "start the gateway on it once") from None
    return store
