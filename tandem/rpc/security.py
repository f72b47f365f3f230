"""One endpoint's security, both sides: TLS files and the bearer token, from `services.<role>`.

`EndpointSecurity.from_section(cfg.services.reward, "services.reward")` reads the section's
`tls.*` and `auth.*` (duck-typed; tandem.rpc does not import the config package) and reads the
token from its file or variable. The server side (`tandem.rpc.server.serve`) binds with
`add_port` and adds `server_interceptors`; the client side (`tandem.rpc.client.make_channel`)
opens `channel`. `PLAINTEXT` is an endpoint with neither. The token is kept out of repr().
"""
from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from tandem.rpc.auth import AUTH_KEY, TokenAuthInterceptor, bearer_token, read_token
from tandem.rpc.tls import TLSFiles


@dataclass(frozen=True)
class EndpointSecurity:
    tls: TLSFiles | None = None
    token: str | None = field(default=None, repr=False)
    health_without_token: bool = False

    @classmethod
    def from_section(cls, section, key_prefix: str) -> EndpointSecurity:
        """`services.<role>` (with .tls and .auth) -> its security; ValueError naming the key."""
        auth = section.auth
        return cls(TLSFiles.from_section(section.tls, f"{key_prefix}.tls"),
                   read_token(auth.token_file, auth.token_env, f"{key_prefix}.auth"),
                   bool(auth.health_without_token))

    @property
    def describe(self) -> dict:
        """What a log line may say about it (never the token)."""
        return {"tls": self.tls is not None, "mutual_tls": bool(self.tls and self.tls.client_auth),
                "token": self.token is not None}

    # ---- server side --------------------------------------------------------------------

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [TokenAuthInterceptor(self.token, self.health_without_token)] if self.token else []

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        """Bind `address` plaintext or with TLS -> the bound port (0: could not bind)."""
        if self.tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.tls.server_credentials())

    # ---- client side --------------------------------------------------------------------

    def channel(self, endpoint: str, options: list[tuple]) -> grpc.aio.Channel:
        interceptors = bearer_token(self.token) if self.token else None
        if self.tls is None:
            return grpc.aio.insecure_channel(endpoint, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(endpoint, self.tls.channel_credentials(),
                                       options=[*options, *self.tls.channel_options()], interceptors=interceptors)


    def sync_channel(self, endpoint: str, options: list[tuple]) -> grpc.Channel:
        """A synchronous channel (threads reading streams in parallel: the weight plane), with
        the same TLS and token as `channel`."""
        if self.tls is None:
            ch = grpc.insecure_channel(endpoint, options=options)
        else:
            ch = grpc.secure_channel(endpoint, self.tls.channel_credentials(),
                                     options=[*options, *self.tls.channel_options()])
        return grpc.intercept_channel(ch, _SyncBearer(self.token)) if self.token else ch


class _SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The bearer token on every call of a synchronous channel."""

    def __init__(self, token: str):
        self._metadata = (AUTH_KEY, f"Bearer {token}")

    def _details(self, details):
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials, self.wait_for_ready = d.credentials, getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


PLAINTEXT = EndpointSecurity()
