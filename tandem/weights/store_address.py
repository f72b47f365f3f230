"""Which rendezvous stores a weight source joins (ActorService.JoinWeightGroup).

A weight group's TCPStore is hosted by the receiver (the rollout front that calls
JoinWeightGroup), so the source accepts a store only on the caller's own address, on this
machine when the caller is on it too (a rollout advertising the machine's address but calling
over loopback), or on a host the source's configuration lists
(`actor_rollout_ref.rollout.weight_sync.store_hosts`: NAT, a separate rendezvous host). Anything
else would let any client point the actor at an arbitrary host:port and keep one of its threads
waiting for the rendezvous, so it is refused before anything connects.
"""
from __future__ import annotations

import ipaddress
import re
import socket

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")


def host_problem(host: str) -> str | None:
    """Why `host` is not a bare host name or IP address (None: it is)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return None
    except ValueError:
        pass
    if _HOSTNAME.match(bare):
        return None
    return f"{host!r} is not a host name or an IP address (store_host and store_port are separate fields)"


def peer_ip(peer: str) -> str | None:
    """The IP address in a gRPC peer string ("ipv4:1.2.3.4:5", "ipv6:[::1]:5"); None otherwise."""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        return peer[5:].rsplit(":", 1)[0].strip("[]").split("%")[0]
    return None


def _addresses(host: str) -> set[str]:
    bare = host[1:-1] if host.startswith("[") else host
    try:
        return {ai[4][0].split("%")[0] for ai in socket.getaddrinfo(bare, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


def _is_local(ip: str) -> bool:
    """An address of this machine (binding to it works)."""
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def store_problem(host: str, peer: str, allowed: tuple[str, ...] | list[str]) -> str | None:
    """Why the source refuses a store on `host` for the caller at `peer` (None: accepted).
    Resolves names (blocking: run it off the event loop)."""
    why = host_problem(host)
    if why:
        return why
    if host in allowed:
        return None
    caller, ips = peer_ip(peer), _addresses(host)
    if not ips:
        return f"store_host {host!r} does not resolve"
    if caller is not None and caller in ips:
        return None
    if caller is not None and _is_local(caller) and all(_is_local(ip) for ip in ips):
        return None
    return (f"store_host {host!r} is not the caller's address ({caller or peer}) nor this machine's, and "
            "not in actor_rollout_ref.rollout.weight_sync.store_hosts")
