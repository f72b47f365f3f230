"""A real grpc.aio server (tandem.rpc.server.serve) as a task of the test's event loop, on port 0."""
import asyncio
import contextlib

from tandem.rpc.server import serve


@contextlib.asynccontextmanager
async def serving(tmp_path, servicers: list, **kw):
    """Start serve(servicers) as a task; yield "127.0.0.1:PORT" once the port file appears."""
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    task = asyncio.create_task(serve(servicers, role="test", port_file=str(port_file), grace_s=0.5, **kw))
    for _ in range(500):
        if port_file.exists() or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()  # raise the startup error
    try:
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
