"""Ini strings to typed values — used by the paste factories and nowhere else.

``convert_options(section, local_conf, table)`` runs every key through its
converter, rejects unknown keys, and names the section and key in every error,
so a typo in an ini file fails at load time rather than on the first request.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError

Converter = Callable[[str], Any]

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def asbool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}")


def asint(value: str | int) -> int:
    return int(value)


def positive_int(value: str | int) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(f"must be positive: {value!r}")
    return number


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def seconds(value: str | float) -> float:
    """``"5"``, ``"2.5s"``, ``"500ms"``, ``"1m"`` → seconds as float."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"not a duration: {value!r}")
    return float(match.group(1)) * _UNIT[match.group(2)]


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)


def size(value: str | int) -> int:
    """``"1048576"``, ``"1MiB"``, ``"512k"`` → bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"not a size: {value!r}")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit]


def aslist(value: str | list[str]) -> list[str]:
    """Whitespace- or comma-separated list; blank items dropped."""
    if isinstance(value, list):
        return value
    return [item for item in re.split(r"[\s,]+", value) if item]


def networks(value: str | list[str]) -> list[str]:
    """A list (as :func:`aslist`) of IP networks in CIDR form; a bare address is a /32 or /128."""
    result = []
    for item in aslist(value):
        try:
            result.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(f"not an IP network (CIDR) or address: {item!r}") from None
    return result


def url(value: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {value!r}")
    return value.strip().rstrip("/")


def text(value: str) -> str:
    return value.strip()


def mapping(value: str | Mapping[str, str]) -> dict[str, str]:
    """Lines of ``key = value`` (an ini continuation block) → dict."""
    if isinstance(value, Mapping):
        return dict(value)
    result: dict[str, str] = {}
    for line in value.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, val = line.partition("=")
        if not sep:
            raise ValueError(f"expected 'key = value', got {line!r}")
        result[key.strip()] = val.strip()
    return result


def convert_options(
    section: str, local_conf: Mapping[str, Any], table: Mapping[str, Converter]
) -> dict[str, Any]:
    """Convert ``local_conf`` through ``table``; unknown keys and bad values are errors.

    Keys may be written with dashes or dots in the ini (``tls-server-name``,
    ``tls.server_name``); they are looked up with underscores.
    """
    options: dict[str, Any] = {}
    for raw_key, raw_value in local_conf.items():
        key = raw_key.replace("-", "_").replace(".", "_")
        converter = table.get(key)
        if converter is None:
            known = ", ".join(sorted(table))
            raise ConfigError(f"[{section}] unknown key {raw_key!r} (known: {known})")
        try:
            options[key] = converter(raw_value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[{section}] bad value for {raw_key!r}: {exc}") from None
    return options
