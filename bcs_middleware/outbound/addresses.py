"""Which addresses the gateway may connect to — decided on the resolved address, when connecting.

A cluster's apiserver addresses are reported by whoever holds the cluster's
register token, so they are input, not configuration: left unchecked, the
gateway would connect wherever it is told — the cloud metadata service at
``169.254.169.254``, its own listening port, a multicast group. A check on the
URL's *text* is no defence: ``0x7f000001``, ``2130706433``, ``127.1`` and
``[::ffff:127.0.0.1]`` all spell ``127.0.0.1``, and a DNS name can resolve to
anything, differently at every lookup. So :meth:`AddressPolicy.connect`
resolves the host once (``getaddrinfo``), checks **every** resolved address,
and connects only to an allowed one, to exactly the address it checked (no
second lookup). TLS still verifies the URL's host name (or the configured
server name): the caller wraps the returned socket as before.

The decision, per resolved address (IPv4-mapped ``::ffff:a.b.c.d`` and
IPv4-compatible ``::a.b.c.d`` forms are judged as the IPv4 address they carry):

1. **Always refused**, whatever the configuration: unspecified (``0.0.0.0/8``,
   ``::``), link-local (``169.254.0.0/16``, ``fe80::/10``), multicast
   (``224.0.0.0/4``, ``ff00::/8``), broadcast and the rest of the reserved
   ``240.0.0.0/4`` — none of them is ever an apiserver; and the gateway's own
   listening sockets (:data:`LISTENERS`; a listener on ``0.0.0.0:P`` or
   ``[::]:P`` stands for every local address with port ``P``).
2. ``deny`` networks (operator configuration): an address in any is refused.
   Deny wins over allow.
3. ``allow`` networks: when the list is given, an address must be in one of
   them ("only these"); when empty, everything not refused above is allowed.

Loopback is allowed by default (labs and tests run clusters there); production
gateways usually add ``deny = 127.0.0.0/8 ::1/128`` and their own private ranges
as they see fit. A name whose every address is refused raises
:class:`~bcs_middleware.outbound.causes.AddressRefused` before any connection is attempted; one with some
allowed addresses connects to those only.

The listening sockets are a property of the process: gunicorn's workers
inherit them, and :func:`bcs_middleware.serving.hooks.post_worker_init` notes them
in every worker through :func:`note_gunicorn_listeners` (``bcs-middleware serve``
and ``examples/gunicorn.conf.py`` install that hook).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

from ..core.errors import ConfigError
from .causes import AddressRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_ALWAYS_REFUSED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("::/128", "unspecified"),
        ("169.254.0.0/16", "link-local"),
        ("fe80::/10", "link-local"),
        ("224.0.0.0/4", "multicast"),
        ("ff00::/8", "multicast"),
        ("240.0.0.0/4", "broadcast or reserved"),
    )
)


def canonical(address: str) -> IPAddress:
    """The address as routing sees it: IPv4-mapped and -compatible IPv6 forms become IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) is no part of it
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        # ::a.b.c.d (RFC 4291 §2.5.5.1, deprecated); :: and ::1 are addresses of their own.
        if int(ip) >> 32 == 0 and int(ip) > 1:
            return ipaddress.IPv4Address(int(ip))
    return ip


def parse_networks(values: Iterable[str], option: str) -> tuple[IPNetwork, ...]:
    """``["127.0.0.0/8", "::1"]`` → networks (a bare address is a /32 or /128).

    :raises ConfigError: naming ``option`` and the bad entry.
    """
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{option}: {value!r} is not an IP network (CIDR) or address") from None
    return tuple(networks)


def _is_local(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address of this host (binding to it succeeds only then)."""
    if ip.is_loopback:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(ip), 0))
        except OSError:
            return False
    return True


class Listeners:
    """The addresses this process accepts connections on: the gateway must never call itself."""

    def __init__(self) -> None:
        self._exact: frozenset[tuple[IPAddress, int]] = frozenset()
        self._any_local: frozenset[int] = frozenset()

    def note(self, sockaddrs: Iterable[Any]) -> None:
        """Remember listening socket addresses (``getsockname()`` results; non-IP ones ignored)."""
        exact, any_local = set(self._exact), set(self._any_local)
        for sockaddr in sockaddrs:
            if not isinstance(sockaddr, tuple) or len(sockaddr) < 2:
                continue  # a Unix socket's path
            ip, port = canonical(str(sockaddr[0])), int(sockaddr[1])
            if ip.is_unspecified:
                any_local.add(port)
            else:
                exact.add((ip, port))
        self._exact, self._any_local = frozenset(exact), frozenset(any_local)

    def forget(self, sockaddrs: Iterable[Any]) -> None:
        """Forget listening sockets this process closed (their ports may go to anybody)."""
        exact, any_local = set(self._exact), set(self._any_local)
        for sockaddr in sockaddrs:
            if not isinstance(sockaddr, tuple) or len(sockaddr) < 2:
                continue
            ip, port = canonical(str(sockaddr[0])), int(sockaddr[1])
            if ip.is_unspecified:
                any_local.discard(port)
            else:
                exact.discard((ip, port))
        self._exact, self._any_local = frozenset(exact), frozenset(any_local)

    def clear(self) -> None:
        self._exact, self._any_local = frozenset(), frozenset()

    def includes(self, ip: IPAddress, port: int) -> bool:
        if (ip, port) in self._exact:
            return True
        return port in self._any_local and _is_local(ip)


#: This process's listening sockets (filled per gunicorn worker; see the module docs).
LISTENERS = Listeners()


def note_gunicorn_listeners(worker: Any) -> None:
    """Record a gunicorn worker's listening sockets in :data:`LISTENERS` (``post_worker_init``)."""
    addresses = []
    for listener in getattr(worker, "sockets", None) or ():
        try:
            addresses.append(getattr(listener, "sock", listener).getsockname())
        except OSError:
            continue
    LISTENERS.note(addresses)


class AddressPolicy:
    """Where upstream connections may go (see the module docs for the exact rules).

    :param allow: networks (CIDR strings or networks); when non-empty, only
        addresses in one of them are allowed.
    :param deny: networks always refused; deny wins over allow.
    :param listeners: the process's own listening sockets (default :data:`LISTENERS`).

    Example::

        policy = AddressPolicy(deny=["127.0.0.0/8", "::1"])
        transport = PooledTransport(address_policy=policy)
    """

    def __init__(self, *, allow: Iterable[str | IPNetwork] = (), deny: Iterable[str | IPNetwork] = (),
                 listeners: Listeners | None = None) -> None:
        self.allow = parse_networks((str(n) for n in allow), "upstream_allow")
        self.deny = parse_networks((str(n) for n in deny), "upstream_deny")
        self.listeners = LISTENERS if listeners is None else listeners

    def refusal(self, address: str, port: int) -> str | None:
        """Why connecting to ``address:port`` is refused, or ``None`` when it is allowed."""
        try:
            ip = canonical(address)
        except ValueError:
            return "not an IP address"
        for network, why in _ALWAYS_REFUSED:
            if ip in network:
                return why
        if self.listeners.includes(ip, port):
            return "the gateway's own listening socket"
        for network in self.deny:
            if ip in network:
                return f"denied by {network}"
        if self.allow and not any(ip in network for network in self.allow):
            return "not in the allowed networks"
        return None

    def literal_refusal(self, host: str, port: int) -> str | None:
        """Why ``host`` is refused when it is an IP address in any spelling, else ``None``.

        For an early, clear answer when addresses are reported (no DNS is asked: a
        name is judged when connecting, like everything else).
        """
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        except (OSError, UnicodeError):
            return None  # a name (or nothing an IP parser accepts)
        for *_, sockaddr in infos:
            why = self.refusal(str(sockaddr[0]), port)
            if why is not None:
                return f"{sockaddr[0]}: {why}"
        return None

    def connect(self, host: str, port: int, timeout: float | None, *, label: str) -> socket.socket:
        """A TCP connection to an allowed address of ``host`` (what ``socket.create_connection`` does, checked).

        :raises AddressRefused: every address of ``host`` is refused (nothing was connected).
        :raises OSError: resolution failed, or connecting to every allowed address failed
            (the last error; :class:`TimeoutError` for a timeout).
        """
        refused: list[str] = []
        error: OSError | None = None
        for family, kind, proto, _name, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            why = self.refusal(str(sockaddr[0]), port)
            if why is not None:
                refused.append(f"{sockaddr[0]} ({why})")
                continue
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            return sock
        if error is not None:
            raise error
        raise AddressRefused(
            f"upstream {label}: {host} resolves only to addresses the upstream address policy refuses: "
            + ", ".join(dict.fromkeys(refused)),
            stage="connect",
        )


#: The policy of a transport built without one: the built-in refusals only.
DEFAULT_POLICY = AddressPolicy()
