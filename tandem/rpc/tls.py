"""TLS for a Tandem port: the PEM files of one endpoint -> grpc server and channel credentials.

One `TLSFiles` describes an endpoint from both sides (the config section
`services.<role>.tls`): the service presents `cert_file` / `key_file`; a client checks that
certificate against `ca_file` (None: the system's roots) under the name `server_name` (None:
the endpoint's host); with `client_auth` (mutual TLS) the service requires a client
certificate signed by `ca_file`, and the client presents `client_cert_file` / `client_key_file`.
A file that cannot be read is a ValueError naming its key.

Deliberately not here: tokens (tandem/rpc/auth.py), making certificates (tests make their own;
operators bring theirs).
"""
from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class TLSFiles:
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    client_auth: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None
    server_name: str | None = None
    key_prefix: str = "tls"  # the dotted config key of this section, for messages

    @classmethod
    def from_section(cls, section, key_prefix: str) -> TLSFiles | None:
        """`services.<role>.tls` (duck-typed: enable, cert_file, ...) -> TLSFiles, or None when off."""
        if not section.enable:
            return None
        return cls(section.cert_file, section.key_file, section.ca_file, section.client_auth,
                   section.client_cert_file, section.client_key_file, section.server_name, key_prefix)

    def _read(self, name: str, required: bool) -> bytes | None:
        path = getattr(self, name)
        if not path:
            if required:
                raise ValueError(f"{self.key_prefix}.{name}: must be set")
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"{self.key_prefix}.{name}: cannot read {path!r}: {e.strerror}") from None

    def server_credentials(self) -> grpc.ServerCredentials:
        """The service's side: its certificate, and with client_auth the CA its callers must be signed by."""
        pair = (self._read("key_file", True), self._read("cert_file", True))
        ca = self._read("ca_file", self.client_auth) if self.client_auth else None
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=self.client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A caller's side: the CA to check the service with, and its own certificate for mutual TLS."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca_file", False),
            private_key=self._read("client_key_file", self.client_auth),
            certificate_chain=self._read("client_cert_file", self.client_auth))

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
