"""The gateway's sign-in settings: a value the composition holds without loading the JWT libraries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["IdentitySettings"]


@dataclass(frozen=True)
class IdentitySettings:
    """The gateway's sign-in settings (``serve --authentication-config``, ini ``authentication_config``
    and ``superuser_groups``).

    :param authentication_config: kube-apiserver's ``AuthenticationConfiguration`` file;
        ``None``: gateway tokens (and client certificates) only.
    :param superuser_groups: users an identity provider puts in one of these groups are superusers.
    """

    authentication_config: Path | None = None
    superuser_groups: tuple[str, ...] = ()

    @classmethod
    def from_ini(cls, values: Mapping[str, Any], context: Any) -> IdentitySettings:
        """The gateway configuration's ``identity`` section from its converted ini keys
        (:mod:`bcs_middleware.compose.ini`)."""
        path = values.get("authentication_config")
        return cls(Path(path) if path else None, tuple(values.get("superuser_groups", ())))
