"""Whether a bind address is reachable from other machines, and the rule for serving there: a port
beyond loopback needs a bearer token unless whoever starts the server says `--insecure`.

A token without TLS travels in cleartext; that is allowed (a private network), the log says so.

Deliberately not here: the token and TLS themselves (auth.py, tls.py, security.py).
"""
from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; every other address (0.0.0.0, '', [::], a name, an
    interface's address) can be reached from elsewhere."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, has_token: bool, insecure: bool) -> str | None:
    """Why serving on `host` is refused (None when it is not): beyond loopback without a token
    and without an explicit `insecure`."""
    if is_loopback(host) or has_token or insecure:
        return None
    return f"{host or '(every interface)'} is reachable beyond loopback and no bearer token is set"
