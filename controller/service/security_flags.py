"""The controller service's TLS and token, as flags: `tandem serve` serves with them, its clients
(`tandem submit | status | logs | cancel | list`) call with them.

The same two things a service's `services.<role>.tls` / `.auth` hold (tandem/rpc/security.py):
`--token-file` / `--token-env` (every call must carry `authorization: Bearer <token>`), and TLS
(`--tls-cert` / `--tls-key` on the server, `--tls-ca` on a client; `--tls-client-auth` for mutual
TLS, the client then presenting `--tls-client-cert` / `--tls-client-key`). A bad flag is a
ValueError naming it.
"""
from __future__ import annotations

import argparse

from tandem.rpc.auth import read_token
from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles

TOKEN_NAMES = ("--token-file", "--token-env")
TLS_FLAGS = {"tls.cert_file": "--tls-cert", "tls.key_file": "--tls-key", "tls.ca_file": "--tls-ca",
             "tls.client_cert_file": "--tls-client-cert", "tls.client_key_file": "--tls-client-key"}


def add_token_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", help="a file holding the bearer token every call carries")
    p.add_argument("--token-env", help="an environment variable holding the bearer token")


def add_server_flags(p: argparse.ArgumentParser) -> None:
    add_token_flags(p)
    p.add_argument("--tls-cert", help="serve TLS with this certificate chain (PEM)")
    p.add_argument("--tls-key", help="... and this private key (PEM)")
    p.add_argument("--tls-ca", help="with --tls-client-auth: the CA that signed the callers' certificates")
    p.add_argument("--tls-client-auth", action="store_true", help="mutual TLS: callers must present a certificate")


def add_client_flags(p: argparse.ArgumentParser) -> None:
    add_token_flags(p)
    p.add_argument("--tls-ca", help="call over TLS, checking the controller against this CA (PEM)")
    p.add_argument("--tls-server-name", help="the name its certificate is checked against (default: the host)")
    p.add_argument("--tls-client-cert", help="mutual TLS: this client's certificate (PEM)")
    p.add_argument("--tls-client-key", help="mutual TLS: this client's key (PEM)")


def server_security(ns: argparse.Namespace) -> EndpointSecurity:
    """`tandem serve`'s port: its TLS files read now, so that a bad one stops it before it serves."""
    tls = None
    if ns.tls_cert or ns.tls_key or ns.tls_client_auth:
        if not (ns.tls_cert and ns.tls_key):
            raise ValueError("--tls-cert and --tls-key: give both")
        tls = TLSFiles(ns.tls_cert, ns.tls_key, ns.tls_ca, ns.tls_client_auth)
        _as_flags(tls.server_credentials)
    return EndpointSecurity(tls, read_token(ns.token_file, ns.token_env, "", TOKEN_NAMES))


def client_security(ns: argparse.Namespace) -> EndpointSecurity:
    """What a client of `tandem serve` calls with."""
    tls = None
    if ns.tls_ca or ns.tls_client_cert:
        tls = TLSFiles(ca_file=ns.tls_ca, client_auth=bool(ns.tls_client_cert), client_cert_file=ns.tls_client_cert,
                       client_key_file=ns.tls_client_key, server_name=ns.tls_server_name)
        _as_flags(tls.channel_credentials)
    return EndpointSecurity(tls, read_token(ns.token_file, ns.token_env, "", TOKEN_NAMES))


def _as_flags(read_files) -> None:
    """Read the TLS files now; a ValueError names the flag (TLSFiles names its config key)."""
    try:
        read_files()
    except ValueError as e:
        message = str(e)
        for key, flag in TLS_FLAGS.items():
            message = message.replace(key, flag)
        raise ValueError(message) from None
