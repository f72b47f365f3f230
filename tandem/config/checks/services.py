"""Checks of services.<role>: the bind address, TLS files and the bearer token's source.

Files are checked where they are named (a service started here needs its certificate and key; a
caller needs the CA, and its own certificate for mutual TLS). The token is looked for, never read
into the config or a message: only the file or variable name is reported.
"""
from __future__ import annotations

import os

from tandem.config.errors import check
from tandem.config.schema import TandemConfig

ROLES = ("actor", "rollout", "critic", "reward")


def _check_file(path: str | None, key: str, required: bool, why: str = "") -> None:
    if path is None:
        check(not required, key, f"must be set{why}")
        return
    check(os.path.isfile(path), key, f"{path!r} is not a readable file")


def check_services(cfg: TandemConfig) -> None:
    """services.<role>.{host, tls.*, auth.*} for every role."""
    for role in ROLES:
        key = f"services.{role}"
        s = getattr(cfg.services, role)
        check(bool(s.host), f"{key}.host", "must not be empty (127.0.0.1: this machine only)")
        tls = s.tls
        if tls.enable:
            started_here = s.endpoint is None
            why = " (the service is started here with TLS)"
            _check_file(tls.cert_file, f"{key}.tls.cert_file", started_here, why)
            _check_file(tls.key_file, f"{key}.tls.key_file", started_here, why)
            _check_file(tls.ca_file, f"{key}.tls.ca_file", tls.client_auth, " for tls.client_auth (mutual TLS)")
            _check_file(tls.client_cert_file, f"{key}.tls.client_cert_file", tls.client_auth,
                        " for tls.client_auth (mutual TLS)")
            _check_file(tls.client_key_file, f"{key}.tls.client_key_file", tls.client_auth,
                        " for tls.client_auth (mutual TLS)")
        else:
            check(not tls.client_auth, f"{key}.tls.client_auth", "needs tls.enable=true")
        auth = s.auth
        check(not (auth.token_file and auth.token_env), f"{key}.auth", "set token_file or token_env, not both")
        if auth.token_file:
            _check_file(auth.token_file, f"{key}.auth.token_file", True)
        if auth.token_env:
            check(bool(os.environ.get(auth.token_env, "").strip()), f"{key}.auth.token_env",
                  f"environment variable {auth.token_env} is not set or empty")
        check(not auth.health_without_token or bool(auth.token_file or auth.token_env),
              f"{key}.auth.health_without_token", "needs a token (auth.token_file or auth.token_env)")
    cache = cfg.services.compile_cache_dir
    check(cache is None or os.path.isabs(cache), "services.compile_cache_dir",
          f"must be an absolute path (services run in their own working directories), got {cache!r}")

