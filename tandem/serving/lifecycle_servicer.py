"""LifecycleService adapter: Configure / Release / Interrupt / Describe over a RunHost.

Model work (building and dropping a run) runs on the service's WorkerThread after the call
in progress; Interrupt and Describe answer at once from the event loop. The role's services
are SERVING in grpc.health.v1 only while a run that uses them is held.
"""
from __future__ import annotations

from grpc_health.v1 import health_pb2

from tandem.config import ConfigError
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.rpc.protocol import check_protocol
from tandem.serving.lifecycle import RunHost
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import lifecycle_pb2

SERVICE = "tandem.v1.LifecycleService"
_SERVING, _NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class LifecycleServicer:
    def __init__(self, host: RunHost, thread: WorkerThread, health):
        self.host, self.thread, self.health = host, thread, health

    def _held_by_other(self, run_id: str) -> FailedPrecondition:
        return FailedPrecondition(f"run_id: this {self.host.role.name} service holds run {self.host.holder!r}, "
                                  f"not {run_id!r}; Release it first")

    async def _set_health(self) -> None:
        for name in self.host.role.service_names:
            await self.health.set(name, _SERVING if name in self.host.servicers else _NOT_SERVING)

    async def Configure(self, request, context):
        if not request.run_id:
            raise InvalidArgument("run_id: must not be empty")
        if not request.config_yaml.strip():
            raise InvalidArgument("config_yaml: must not be empty (the run's resolved config.yaml)")
        check_protocol(request.protocol, f"{self.host.role.name} service's", "the caller")
        if self.host.holder is not None:
            raise self._held_by_other(request.run_id)
        self.host.pending = request.run_id  # a second Configure now sees the holder
        self.host.check_caller = True  # a run taken by RPC: calls tagged with another run are refused
        try:
            pids, restarted = await self.thread.run(self.host.configure, request.run_id, request.config_yaml,
                                                    self.thread)
        except (ConfigError, ValueError) as e:
            raise InvalidArgument(str(e)) from None
        finally:
            self.host.pending = None
        await self._set_health()
        return lifecycle_pb2.ConfigureResponse(run_id=request.run_id, pids=pids, ranks_restarted=restarted)

    async def Release(self, request, context):
        held = self.host.run_id
        if request.run_id and request.run_id != held:
            raise self._held_by_other(request.run_id) if held else FailedPrecondition(
                f"run_id: this {self.host.role.name} service holds no run (asked to release {request.run_id!r})")
        if held is None:
            return lifecycle_pb2.ReleaseResponse()
        self.host.servicers = {}  # new calls are refused from now on; the running one finishes first
        await self._set_health()
        released = await self.thread.run(self.host.release)
        return lifecycle_pb2.ReleaseResponse(released_run_id=released or "")

    async def Interrupt(self, request, context):
        held = self.host.run_id
        if request.run_id and held and request.run_id != held:
            raise self._held_by_other(request.run_id)
        if held:
            self.host.interrupt()
        return lifecycle_pb2.InterruptResponse(run_id=held or "")

    async def Describe(self, request, context):
        return lifecycle_pb2.DescribeResponse(**self.host.describe())
