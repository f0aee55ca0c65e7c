"""The guard against server-side request forgery in page and image fetches (``/web_scrape``,
``/image_search``).

A URL chosen by a caller must not make the gateway talk to the machine it runs on or to the
networks behind it: loopback, private, link-local, multicast, reserved and unspecified
addresses, shared address space (100.64.0.0/10), cloud metadata endpoints, and the IPv6 forms
that carry such an IPv4 address (mapped ``::ffff:a.b.c.d``, compatible ``::a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4) are refused.

The check sits under httpx, in the network backend (:class:`GuardedBackend`): every new TCP
connection, the first one and each one a redirect opens, resolves the host once, checks every
address it got and connects to a checked address. The URL is never resolved a second time,
so DNS cannot answer differently between the check and the connect (rebinding). Numeric host
spellings (``127.1``, ``2130706433``, ``0x7f.1``) go through the same ``getaddrinfo``, which
turns them into the address that is checked. TLS still verifies the URL's host name (httpcore
takes SNI and the certificate check from the URL, not from the address we connect to).

An operator re-opens hosts with the ``fetch_allow_hosts`` config key (:class:`AllowList`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Metadata services answer credentials to whoever asks from inside the VM. Most sit in ranges
# refused anyway; 168.63.129.16 (Azure's wire server) is a public address, so it is named.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
    )
)

SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known NAT64 prefix: the low 32 bits are IPv4
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated "::a.b.c.d"; no legitimate use

# Refused on top of what ``is_global`` says: Python's table changes between patch releases
# (3.11.7 calls multicast and 192.0.0.192 global), so the ranges that matter are named here.
SPECIAL_RANGES = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "::1/128", "::/128", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip

FLAGS = ("loopback", "unspecified", "multicast", "link_local", "private", "reserved")


def parse_address(text: str) -> IPAddress:
    """An address as ``getaddrinfo`` writes it; an IPv6 zone (``fe80::1%eth0``) is dropped."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64 or ip in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def refusal(address: str | IPAddress) -> str | None:
    """Why the gateway must not connect to ``address``; None for a public address.

    >>> refusal("93.184.215.14") is None
    True
    >>> refusal("::ffff:127.0.0.1")
    'loopback (as 127.0.0.1)'
    """
    ip = parse_address(address) if isinstance(address, str) else address
    if ip in METADATA:
        return "cloud metadata endpoint"
    if isinstance(ip, ipaddress.IPv6Address) and not (ip.is_loopback or ip.is_unspecified):
        inner = embedded_ipv4(ip)
        if inner is not None and ip in IPV4_COMPATIBLE:
            return f"deprecated IPv4-compatible address (as {inner})"
        if inner is not None:
            why = refusal(inner)
            return None if why is None else f"{why} (as {inner})"
    for flag in FLAGS:
        if getattr(ip, f"is_{flag}"):
            return flag.replace("_", "-")
    if ip in SHARED:
        return "shared address space"
    for net in SPECIAL_RANGES:
        if ip in net:
            return f"special-purpose range {net}"
    return None if ip.is_global else "not globally routable"


# --- the allow-list --------------------------------------------------------------------------

HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?\.?")


@dataclass(frozen=True)
class AllowRule:
    """One ``fetch_allow_hosts`` entry: a host name (matched against the URL's host, whatever
    it resolves to) or a network (matched against the resolved address), optionally one port."""

    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None

    def matches(self, host: str, port: int, ip: IPAddress) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.name is not None:
            return host == self.name
        return self.network is not None and ip in self.network


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{entry!r}: port must be 1..65535")
    return int(text)


def _split_port(text: str, entry: str) -> tuple[str, int | None]:
    if text.startswith("["):  # [v6] or [v6]:port
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r}: write an IPv6 address with a port as [ADDRESS]:PORT")
        return host, _port(rest[1:], entry) if rest else None
    if text.count(":") == 1:  # name:port or v4:port (a bare IPv6 address has several colons)
        host, _, port = text.partition(":")
        return host, _port(port, entry)
    return text, None


def parse_allow_rule(entry: str) -> AllowRule:
    """``name``, ``name:port``, ``address``, ``address:port`` (``[v6]:port``) or ``cidr``.

    >>> parse_allow_rule("Intranet.Example:8080")
    AllowRule(name='intranet.example', network=None, port=8080)
    """
    text = entry.strip().lower()
    if "/" in text:
        try:
            return AllowRule(network=ipaddress.ip_network(text))
        except ValueError as err:
            raise ValueError(f"{entry!r} is not a CIDR range: {err}") from None
    host, port = _split_port(text, entry)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not HOSTNAME.fullmatch(host):
            raise ValueError(f"{entry!r} is not a host name, IP address or CIDR range") from None
        return AllowRule(name=host.rstrip("."), port=port)
    return AllowRule(network=ipaddress.ip_network(ip), port=port)


class AllowList:
    """The operator's exceptions to :func:`refusal` (``fetch_allow_hosts``)."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.rules = tuple(parse_allow_rule(e) for e in entries)

    def allows(self, host: str, port: int, ip: IPAddress) -> bool:
        name = host.lower().rstrip(".")
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # "127.0.0.1" in the list also covers ::ffff:127.0.0.1
        return any(rule.matches(name, port, ip) for rule in self.rules)


# --- the network backend ---------------------------------------------------------------------


class BlockedAddress(httpcore.ConnectError):
    """A connection the guard refused before any packet was sent."""


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address ``getaddrinfo`` gives for ``host``, in its order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the address check in front of every TCP connect.

    ``inner`` makes the connections (httpcore's default backend); ``resolve`` replaces
    :func:`system_resolve` (tests)."""

    def __init__(
        self,
        allow: AllowList,
        inner: httpcore.AsyncNetworkBackend | None = None,
        resolve: Resolver | None = None,
    ) -> None:
        self.allow = allow
        self._inner = inner or httpcore.AnyIOBackend()
        self._resolve = resolve or system_resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.checked_addresses(host, port, timeout)
        last: httpcore.ConnectError | None = None
        for address in addresses:  # the checked addresses only, never the name again
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as err:
                last = err
        assert last is not None
        raise last

    async def checked_addresses(self, host: str, port: int, timeout: float | None) -> list[str]:
        """``host``'s addresses, or :class:`BlockedAddress` when any of them is refused (an
        answer mixing public and private addresses is a rebinding attempt, not a choice)."""
        try:
            async with asyncio.timeout(timeout):
                addresses = await self._resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except (OSError, UnicodeError) as err:
            raise httpcore.ConnectError(f"cannot resolve {host}: {err}") from None
        if not addresses:
            raise httpcore.ConnectError(f"{host} has no address")
        for address in addresses:
            ip = parse_address(address)
            why = None if self.allow.allows(host, port, ip) else refusal(ip)
            if why is not None:
                raise BlockedAddress(f"{host}:{port} resolves to {address}: {why}")
        return addresses

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise BlockedAddress("unix sockets are never fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport on a :class:`GuardedBackend` (its pool rebuilt with that backend;
    TLS verification as httpx's default)."""

    def __init__(self, backend: GuardedBackend, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )


def guarded_client(
    allow_hosts: Sequence[str], *, max_connections: int, user_agent: str, max_redirects: int = 5
) -> httpx.AsyncClient:
    """The client of page and image fetches. ``trust_env=False``: a proxy from the environment
    (HTTP(S)_PROXY, ALL_PROXY) would resolve and connect on our behalf, past the check, and
    ~/.netrc credentials must not go to arbitrary hosts."""
    limits = httpx.Limits(max_connections=max_connections)
    return httpx.AsyncClient(
        transport=GuardedTransport(GuardedBackend(AllowList(allow_hosts)), limits),
        headers={"User-Agent": user_agent},
        max_redirects=max_redirects,
        trust_env=False,
    )
