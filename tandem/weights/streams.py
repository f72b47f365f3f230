"""The stream transport's receiving side: the flat layout read as parallel gRPC streams.

The layout is cut into `streams` contiguous parts; each is one ActorService.StreamWeights call
on its own channel (its own TCP connection) read in its own thread through grpc's synchronous
API, so receiving and copying into the staging buffer run outside the event loop and in
parallel (on one host a single Python gRPC stream is bound by one core; across a network
several connections also beat one connection's window). Each stream is checked on its own:
its manifest is the one asked about, its chunks come in order, inside its part and no larger
than asked, and its end message closes exactly that part. The first failure cancels the other
streams and is raised as the TandemError of its status (the source's, or INVALID_ARGUMENT).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc

from tandem.rpc.errors import InvalidArgument, error_from_rpc
from tandem.v1 import weights_pb2
from tandem.weights import wire
from tandem.weights.layout import Manifest

METHOD = "/tandem.v1.ActorService/StreamWeights"
MAX_MESSAGE = 512 << 20


def parts(total: int, streams: int, align: int = 1 << 20) -> list[tuple[int, int]]:
    """`streams` contiguous parts of [0, total), cut at multiples of `align` (fewer when small)."""
    step = max(align, -(-total // max(1, streams) // align) * align)
    return [(a, min(a + step, total)) for a in range(0, total, step)] or [(0, 0)]


class Channels:
    """Synchronous channels to one source, one per stream, kept from sync to sync (a new
    connection per stream and sync costs a TCP and HTTP/2 handshake each time)."""

    def __init__(self, security=None):
        """security: tandem.rpc.security.EndpointSecurity of the source (TLS, token); None: plaintext."""
        self.endpoint, self.channels = None, []
        self.security = security

    def get(self, endpoint: str, n: int) -> list[grpc.Channel]:
        if endpoint != self.endpoint:
            self.close()
            self.endpoint = endpoint
        options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.use_local_subchannel_pool", 1)]
        while len(self.channels) < n:
            self.channels.append(self.security.sync_channel(endpoint, options) if self.security is not None
                                 else grpc.insecure_channel(endpoint, options=options))
        return self.channels[:n]

    def close(self) -> None:
        for c in self.channels:
            c.close()
        self.endpoint, self.channels = None, []


def receive(channels: list[grpc.Channel], manifest: Manifest, chunk: int, writers, check, timeout_s: float) -> int:
    """Read the whole layout of `manifest` as one stream per channel: writers() -> a fresh
    writer (write(offset, data), close()) per stream; check(manifest, what) raises on a manifest
    that is not the expected layout. Blocking; -> bytes received."""
    calls: list = []
    with ThreadPoolExecutor(len(channels), thread_name_prefix="tandem-stream") as pool:
        futures = [pool.submit(_one, channel, manifest, chunk, a, b, writers(), check, timeout_s, calls)
                   for channel, (a, b) in zip(channels, parts(manifest.total_bytes, len(channels)))]
        try:
            return sum(f.result() for f in futures)
        except BaseException:
            for call in list(calls):
                call.cancel()
            raise


def _one(channel: grpc.Channel, manifest: Manifest, chunk: int, start: int, end: int, writer, check,
         timeout_s: float, calls: list) -> int:
    request = weights_pb2.StreamWeightsRequest(weights_version=manifest.version, chunk_bytes=chunk, start=start,
                                               end=end)
    call = channel.unary_stream(METHOD, request_serializer=weights_pb2.StreamWeightsRequest.SerializeToString,
                                response_deserializer=None)(request, timeout=timeout_s)
    calls.append(call)
    try:
        at = _read(call, manifest, chunk, start, end, writer, check)
    except grpc.RpcError as e:
        raise error_from_rpc(e, "ActorService.StreamWeights") from None
    finally:
        writer.close()
    return at - start


def _read(call, manifest: Manifest, chunk: int, start: int, end: int, writer, check) -> int:
    at, seen, ended = start, False, False
    for data in call:
        msg = wire.parse_stream_message(data)
        if msg[0] == "chunk" and seen and not ended and msg[1] == at and 0 < len(msg[2]) <= chunk \
                and at + len(msg[2]) <= end:
            writer.write(at, msg[2])  # the common case first: the next chunk, in bounds
            at += len(msg[2])
            continue
        if ended:
            raise InvalidArgument("weights stream: a message after the end message")
        if msg[0] == "manifest":
            if seen:
                raise InvalidArgument("weights stream: a second manifest")
            if msg[1].version != manifest.version:
                raise InvalidArgument(f"weights stream: version {msg[1].version}, asked {manifest.version}")
            check(msg[1], "weights stream")
            seen = True
        elif msg[0] == "chunk":
            _, offset, data = msg
            if not seen:
                raise InvalidArgument("weights stream: a chunk before the manifest")
            if offset != at:
                raise InvalidArgument(f"weights stream: a chunk at byte {offset}, expected {at}")
            raise InvalidArgument(f"weights stream: a chunk of {len(data)} bytes at byte {offset} (chunks are "
                                  f"1..{chunk} bytes inside the stream's part [{start}, {end}) of the "
                                  f"{manifest.total_bytes}-byte layout)")
        else:
            _, version, sent = msg
            if (version, sent, at) != (manifest.version, end - start, end):
                raise InvalidArgument(f"weights stream: ended at byte {at} with version {version} and {sent} bytes; "
                                      f"expected version {manifest.version}, {end - start} bytes ending at {end}")
            ended = True
    if not ended:
        raise InvalidArgument(f"weights stream: ended after {at - start} of {end - start} bytes without its end message")
    return at
