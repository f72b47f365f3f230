"""The bearer-token interceptor on a streaming method too (the weight plane serves server streams):
an in-process grpc.aio server, a unary and a server-streaming method behind TokenAuthInterceptor,
called through channels with and without the bearer_token client interceptors."""
import asyncio
import re

import grpc

from tandem.rpc.auth import TokenAuthInterceptor, bearer_token, read_token


async def _serve():
    async def unary(request, context):
        return b"pong"

    async def stream(request, context):
        for part in (b"a", b"b"):
            yield part

    server = grpc.aio.server(interceptors=[TokenAuthInterceptor("t0ken")])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {
        "Ping": grpc.unary_unary_rpc_method_handler(unary),
        "Parts": grpc.unary_stream_rpc_method_handler(stream)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _calls(endpoint, token):
    interceptors = bearer_token(token) if token else None
    async with grpc.aio.insecure_channel(endpoint, interceptors=interceptors) as ch:
        out = []
        for call in (lambda: ch.unary_unary("/test.Echo/Ping")(b"", timeout=10),
                     lambda: _collect(ch.unary_stream("/test.Echo/Parts")(b"", timeout=10))):
            try:
                out.append((grpc.StatusCode.OK, await call()))
            except grpc.aio.AioRpcError as e:
                out.append((e.code(), e.details()))
        return out


async def _collect(stream):
    return [part async for part in stream]


def test_token_on_unary_and_streaming_methods():
    async def main():
        server, endpoint = await _serve()
        try:
            assert await _calls(endpoint, "t0ken") == [(grpc.StatusCode.OK, b"pong"), (grpc.StatusCode.OK, [b"a", b"b"])]
            for token, why in ((None, "missing bearer token"), ("t0ken-", "invalid bearer token")):
                assert await _calls(endpoint, token) == [(grpc.StatusCode.UNAUTHENTICATED, why + (
                    " (metadata 'authorization: Bearer <token>')" if token is None else ""))] * 2
        finally:
            await server.stop(0)
    asyncio.run(main())
    assert "t0ken" not in repr(bearer_token("t0ken"))


def test_read_token_sources(tmp_path, monkeypatch):
    f = tmp_path / "tok"
    f.write_text("  abc \n")
    monkeypatch.setenv("TANDEM_T", "xyz")
    assert read_token(str(f), None) == "abc" and read_token(None, "TANDEM_T") == "xyz" and read_token(None, None) is None
    f.write_text("\n")
    for args, message in (((str(f), None), "auth.token_file: .* is empty"), ((None, "TANDEM_NONE"), "TANDEM_NONE is not set"),
                          ((str(f), "TANDEM_T"), "not both")):
        monkeypatch.delenv("TANDEM_NONE", raising=False)
        try:
            read_token(*args)
        except ValueError as e:
            assert re.search(message, str(e)), str(e)
        else:
            raise AssertionError(args)
