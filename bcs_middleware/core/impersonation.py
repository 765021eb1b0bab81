"""Who the gateway asks a cluster to act as: a value, rendered as headers in one place.

The routing layer decides *whom* to impersonate (a non-superuser, with RBAC on) and puts
an :class:`Impersonation` on the :class:`~bcs_middleware.core.environ.Upstream`; the
proxy and the cluster reader (reading *as the caller*) send it as kube-apiserver's
``Impersonate-*`` headers through :func:`impersonation_headers`, and the audit log reads
the value itself. No layer encodes an identity into headers and no layer decodes one
back out of them.

The header names are kube-apiserver's
(``staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go``, the
``authenticationv1.Impersonate*Header`` constants): ``Impersonate-User``,
``Impersonate-Uid``, ``Impersonate-Group`` (one field per group, in order) and
``Impersonate-Extra-{key}`` (one field per value; the key percent-encoded as the
apiserver's ``unescapeExtraKey`` reads it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["AUTHENTICATED", "Impersonation", "impersonation_headers"]

#: The group kube-apiserver gives every authenticated user; an impersonated user gets it too.
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True, slots=True)
class Impersonation:
    """The identity a cluster is asked to act as.

    :param user: the user name (``Impersonate-User``).
    :param groups: the groups, in order (``Impersonate-Group`` each): a gateway user's
        :attr:`~bcs_middleware.core.environ.User.kubernetes_groups`.
    :param uid: the user's uid (``Impersonate-Uid``), ``""`` for none.
    :param extra: ``(key, values)`` pairs (``Impersonate-Extra-{key}``).
    """

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@functools.lru_cache(maxsize=4096)
def impersonation_headers(impersonation: Impersonation) -> tuple[tuple[str, str], ...]:
    """The ``Impersonate-*`` header fields of ``impersonation`` (values are immutable: cached)."""
    headers = [("Impersonate-User", impersonation.user)]
    if impersonation.uid:
        headers.append(("Impersonate-Uid", impersonation.uid))
    headers.extend(("Impersonate-Group", group) for group in impersonation.groups)
    for key, values in impersonation.extra:
        name = "Impersonate-Extra-" + quote(key, safe="")
        headers.extend((name, value) for value in values)
    return tuple(headers)
