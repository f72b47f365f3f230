"""Checks of where services run: trainer.launcher, the shape of each role's bind address, its Ray placement.

LAUNCHERS mirrors controller/launchers' registry (the library does not import the controller;
tests/unit/test_launchers.py keeps the two equal).
"""
from __future__ import annotations

import ipaddress

from tandem.config.errors import check
from tandem.config.schema import TandemConfig

LAUNCHERS = ("local", "compose", "ray")
ROLES = ("actor", "rollout", "critic", "reward")
# services.<role>.ray.strategy: Ray's placement-group strategies (None: chosen from the role's TP)
RAY_STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")


def _is_host(host: str) -> bool:
    if not host or host != host.strip() or " " in host:
        return False
    if ":" not in host:
        return True
    try:  # only an IPv6 address may contain a colon
        ipaddress.IPv6Address(host.strip("[]"))
        return True
    except ValueError:
        return False


def check_placement(cfg: TandemConfig) -> None:
    """trainer.launcher names a known launcher; services.<role>.{host,ray.*} are usable."""
    launcher = cfg.trainer.launcher
    check(launcher in LAUNCHERS, "trainer.launcher", f"unknown launcher {launcher!r}; known: {', '.join(LAUNCHERS)}")
    for role in ROLES:
        s = getattr(cfg.services, role)
        key = f"services.{role}"
        check(_is_host(s.host), f"{key}.host",
              f"{s.host!r} must be an address or host name without a port (e.g. 127.0.0.1, 0.0.0.0)")
        r = s.ray
        check(r.strategy is None or r.strategy in RAY_STRATEGIES, f"{key}.ray.strategy",
              f"{r.strategy!r}; known: {', '.join(RAY_STRATEGIES)} (or null)")
        check(r.num_cpus >= 0, f"{key}.ray.num_cpus", f"{r.num_cpus} must be >= 0")
        check(r.num_gpus >= 0, f"{key}.ray.num_gpus", f"{r.num_gpus} must be >= 0")
        bad = {k: v for k, v in r.resources.items() if not isinstance(v, (int, float)) or v < 0}
        check(not bad, f"{key}.ray.resources", f"amounts must be numbers >= 0, got {bad}")
