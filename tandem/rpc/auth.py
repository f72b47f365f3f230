"""Bearer-token authentication on a Tandem port: the server interceptor and the caller's metadata.

A caller sends `authorization: Bearer <token>` with every call (`bearer_token`: client
interceptors on the channel, so health checks and streams carry it too). The server's
`TokenAuthInterceptor` compares it with the expected token in constant time
(`hmac.compare_digest`) and answers UNAUTHENTICATED otherwise, before the request is parsed;
health checks pass without a token only when the endpoint is configured so.

The token comes from a file or an environment variable (`read_token`), never from the config
itself, and is never logged: messages name where it was read from, not what it is.

Deliberately not here: TLS (tandem/rpc/tls.py); authorisation beyond "holds the endpoint's token".
"""
from __future__ import annotations

import hmac
import os

import grpc

AUTH_KEY = "authorization"
_HEALTH = "/grpc.health.v1.Health/"


def read_token(token_file: str | None, token_env: str | None, key_prefix: str = "auth",
               names: tuple[str, str] = ("token_file", "token_env")) -> str | None:
    """The token from `token_file` (surrounding whitespace stripped) or the variable `token_env`;
    None when neither is set. ValueError naming the key (`key_prefix`.`names[i]`, or the bare name
    without a prefix: a command-line flag) when the source is empty or unreadable."""
    file_key, env_key = (f"{key_prefix}.{n}" if key_prefix else n for n in names)
    if token_file and token_env:
        raise ValueError(f"{file_key}, {env_key}: set one of them, not both")
    if token_file:
        try:
            with open(token_file) as f:
                token = f.read().strip()
        except OSError as e:
            raise ValueError(f"{file_key}: cannot read {token_file!r}: {e.strerror}") from None
        if not token:
            raise ValueError(f"{file_key}: {token_file!r} is empty")
        return token
    if token_env:
        token = os.environ.get(token_env, "").strip()
        if not token:
            raise ValueError(f"{env_key}: environment variable {token_env} is not set or empty")
        return token
    return None


def _deny(handler, message: str):
    """A handler of the same kind as `handler` that answers UNAUTHENTICATED without parsing the request."""
    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    if handler is not None and handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only with `authorization: Bearer <token>` (health: optionally without)."""

    def __init__(self, token: str, health_without_token: bool = False):
        if not token:
            raise ValueError("TokenAuthInterceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()
        self._health_open = health_without_token

    def _check(self, metadata) -> str | None:
        """None if authorised, else why not (never echoing what was sent)."""
        sent = [v for k, v in metadata or () if k == AUTH_KEY]
        if not sent:
            return "missing bearer token (metadata 'authorization: Bearer <token>')"
        value = sent[0].encode() if isinstance(sent[0], str) else bytes(sent[0])
        if len(sent) > 1 or not hmac.compare_digest(value, self._expected):
            return "invalid bearer token"
        return None

    async def intercept_service(self, continuation, handler_call_details):
        if self._health_open and handler_call_details.method.startswith(_HEALTH):
            return await continuation(handler_call_details)
        problem = self._check(handler_call_details.invocation_metadata)
        if problem is None:
            return await continuation(handler_call_details)
        return _deny(await continuation(handler_call_details), problem)


class _BearerToken:
    """Adds `authorization: Bearer <token>` to a call's metadata."""

    def __init__(self, token: str):
        self._pair = (AUTH_KEY, f"Bearer {token}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<hidden>)"

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._pair)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)


class _UnaryBearer(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamBearer(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


def bearer_token(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding the token to every unary and server-streaming call of a channel
    (grpc.aio files an interceptor under one call kind only, so one object per kind)."""
    return [_UnaryBearer(token), _StreamBearer(token)]
