"""`tandem serve`: the long-lived controller service.

It opens (or reopens) its state directory (runs.sqlite, services/ with the pool's logs and
pool.json), reattaches to the services a previous controller started that are still alive,
gives back the runs they still hold, applies each interrupted run's restart policy
(controller/service/queue.py `recover`), then serves ControllerService over gRPC and the
status page over HTTP while the queue runs the submitted runs one after another.

STATE_DIR/controller.json says where it listens ({"grpc", "http", "pid"}). Its gRPC port takes
`tandem serve`'s TLS and token; the services its pool starts each require the pool's own token
(STATE_DIR/services/pool.token), which the runs it lends them to call with. SIGTERM / Ctrl-C:
the running run stops at its next safe point (it stays `running` and the next controller
resumes or fails it), and the services this controller started are stopped.
"""
from __future__ import annotations

import json
import os

from tandem.controller.service.pool import ServicePool
from tandem.controller.service.queue import RunQueue, recover
from tandem.controller.service.records import Records
from tandem.controller.service.servicer import SERVICE, ControllerServicer
from tandem.controller.service.status_page import start_status_page
from tandem.logging import configure_logging, get_logger
from tandem.rpc.errors import TandemError
from tandem.rpc.security import PLAINTEXT, EndpointSecurity

_log = get_logger("controller.service.server")
INFO_FILE = "controller.json"


def run_controller(state_dir: str, host: str, port: int, http_port: int, port_file: str | None = None,
                   attach: dict[str, str] | None = None, start_roles: tuple[str, ...] = (),
                   keep_services: bool = False, security: EndpointSecurity = PLAINTEXT,
                   allow_dirs: list[str] | None = None, http_host: str = "127.0.0.1") -> None:
    """security: the gRPC port's TLS and token; allow_dirs: where runs may name code to import
    (tandem/serving/allowed_dirs.py); http_host: the status page's address (it takes no token)."""
    from tandem.rpc.server import run_server

    state_dir = os.path.abspath(state_dir)
    configure_logging(role="controller")
    records = Records(state_dir)
    pool = ServicePool(state_dir, attach, allow_dirs=allow_dirs)
    reattached = pool.reattach()
    recovered = recover(records)
    _log.info("controller.starting", state_dir=state_dir, reattached=reattached, recovered=recovered)
    queue = RunQueue(records, pool)
    httpd = start_status_page(records, http_host, http_port)
    try:
        run_server(_serve(records, pool, queue, state_dir, host, port, port_file, (http_host, httpd.server_port),
                          start_roles, security))
    finally:
        queue.stop()
        httpd.shutdown()
        if not keep_services:
            pool.stop()
        records.close()


async def _serve(records, pool, queue, state_dir, host, port, port_file, http, start_roles, security) -> None:
    from tandem.rpc.server import serve

    http_host, http_port = http

    async def ready() -> None:
        try:
            freed = await pool.reclaim()  # runs a killed controller left on its services
        except TandemError as e:
            _log.warning("pool.reclaim_failed", error=str(e))
            freed = {}
        if start_roles:
            await pool.ensure(start_roles)
        queue.start()
        _log.info("controller.ready", freed=freed, http=f"http://{http_host}:{http_port}/")

    grpc_port_file = port_file or os.path.join(state_dir, "controller.port")

    async def announce() -> None:
        await ready()
        with open(os.path.join(state_dir, INFO_FILE), "w") as f:
            json.dump({"http": f"http://{http_host}:{http_port}/", "pid": os.getpid(), "port_file": grpc_port_file}, f)
        print(f"tandem: controller state in {state_dir}; status page http://{http_host}:{http_port}/", flush=True)

    await serve([(SERVICE, ControllerServicer(records, queue, pool))], role="controller", host=host, port=port,
                port_file=grpc_port_file, on_ready=announce, security=security)
