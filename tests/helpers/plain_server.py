"""Run a plain grpc.aio server (the test helpers' own, not tandem.rpc.server) on 127.0.0.1:0 until
SIGTERM, its port written atomically to a file once it is serving (what server_process waits for)."""
import asyncio
import os
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


async def serve_until_stopped(server: grpc.aio.Server, port_file: str, with_health: bool = True) -> None:
    if with_health:
        h = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(h, server)
        await h.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(port_file + ".tmp", port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)
