"""Where the scheduler listens and what address it advertises to ``Client`` programs (daisy 2.0.0's rules).

:func:`resolve_host` turns ``run_blockwise(host=...)`` into the address to bind and the
one to advertise; :func:`detect_address` picks an address of this machine that other
machines can use (:func:`candidate_addresses`, each checked with a connection to the
listener itself); :func:`describe` says it all in one line for the logs. Policy only: the
sockets are :mod:`.transport`'s.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daisy_nb.runtime.net.transport import Listener

__all__ = ["candidate_addresses", "describe", "detect_address", "resolve_host"]

logger = logging.getLogger("daisy")


def resolve_host(host) -> tuple[str, str | None]:
    """``(address to bind, address to advertise to workers)`` for ``run_blockwise(host=...)``.

    As daisy 2.0.0: ``None``/``""`` binds every interface (``0.0.0.0``) and the address
    to advertise is detected once the listener is up (``None`` here; see
    :func:`detect_address`). ``"0.0.0.0"``/``"::"`` bind every interface and advertise a
    detected address too (daisy 2.0.0 advertises the wildcard itself, which no other
    machine can use). A loopback host (``"127.0.0.1"``, any ``127.x``, ``"::1"``,
    ``"localhost"``) binds only that address: this machine only. Anything else (an
    address or a name, possibly one only the compute nodes resolve, or a container's
    external address) binds every interface and is advertised as given, as daisy does.
    """
    if host is None or host == "":
        return "0.0.0.0", None
    if not isinstance(host, str):
        raise TypeError(f"host must be a string (an address or host name of this machine), got {type(host).__name__}")
    if host in ("0.0.0.0", "::"):
        return host, None
    if _is_loopback(host):
        return host, host
    return "0.0.0.0", host


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


ROUTE_PROBE = ("192.0.2.1", 9)  # TEST-NET-1: a UDP connect() to it picks the default route; nothing is sent


def _routable(ip: str) -> bool:
    try:
        a = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    return not (a.is_loopback or a.is_unspecified or a.is_multicast)


def candidate_addresses() -> list[tuple[str, str]]:
    """``[(IPv4 address, where it came from)]``, in daisy 2.0.0's order: this host's
    resolved name (``gethostname`` -> ``getaddrinfo``, first non-loopback), then the
    interface of the default route (a UDP socket "connected" to a TEST-NET address;
    no packet is sent). Loopback answers are skipped."""
    out: list[tuple[str, str]] = []
    try:
        name = socket.gethostname()
        for info in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM):
            ip = str(info[4][0])
            if _routable(ip):
                out.append((ip, f"host name {name!r}"))
                break
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(ROUTE_PROBE)
            ip = str(s.getsockname()[0])
        if _routable(ip) and all(ip != c[0] for c in out):
            out.append((ip, "default route"))
    except OSError:
        pass
    return out


def detect_address(listener: Listener) -> str:
    """The address to advertise for a listener on every interface (daisy 2.0.0's rule).

    The first of :func:`candidate_addresses` that passes a connectivity check (a TCP
    connection from this machine to the listener at that address, greeted by its
    handshake); else ``127.0.0.1`` with a warning that other machines cannot connect.
    """
    for ip, source in candidate_addresses():
        if listener.reaches(ip):
            logger.info("advertising auto-detected address %s (from the %s)", ip, source)
            return ip
        logger.warning(
            "address %s (from the %s) failed its connectivity check and will not be advertised "
            "(a firewall may be blocking non-loopback interfaces)",
            ip,
            source,
        )
    fallback = "127.0.0.1" if listener.family == socket.AF_INET or listener.reaches("127.0.0.1") else "::1"
    logger.warning(
        "no reachable non-loopback address found; advertising %s. Workers on other machines cannot connect "
        "(pass run_blockwise(host=...) or DAISY_HOST: an address of this machine they can reach)",
        fallback,
    )
    return fallback


def describe(bind_host: str, port: int, advertised: str) -> str:
    """``"listens on 0.0.0.0:PORT (every interface), advertised to workers as 192.0.2.2:PORT"``."""
    where = f"[{bind_host}]" if ":" in bind_host else bind_host
    every = " (every interface)" if bind_host in ("0.0.0.0", "::") else ""
    adv = f"[{advertised}]" if ":" in advertised else advertised
    return f"listens on {where}:{port}{every}, advertised to workers as {adv}:{port}"
