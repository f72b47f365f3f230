"""The gRPC face of a role's services in a long-lived process: a proxy per service name.

The server registers its handlers once, at start; the servicers that do the work are
built per run (tandem/serving/lifecycle.py). `SlotServicer` forwards each call to the held
run's servicer for its service, or answers FAILED_PRECONDITION when no run is held (or the
run does not use that service, e.g. the actor's RolloutService behind a standalone
rollout). A call tagged with another run's x-run-id is refused the same way, so a
controller that lost track of its run cannot drive the next run's models. Server-streaming
methods (the weight plane's StreamWeights) are forwarded as streams.
"""
from __future__ import annotations

from google.protobuf import descriptor_pool

from tandem.rpc.errors import FailedPrecondition


class SlotServicer:
    def __init__(self, host, service: str):
        self._host = host
        self._service = service

    def _target(self, context):
        """The held run's servicer for this service, for this caller."""
        host, service = self._host, self._service
        target = host.servicers.get(service)
        if target is None:
            why = (f"holds run {host.run_id!r}, which does not use {service}" if host.run_id
                   else "holds no run; call tandem.v1.LifecycleService.Configure first")
            raise FailedPrecondition(f"this {host.role.name} service {why}")
        caller = dict(context.invocation_metadata() or ()).get("x-run-id")
        if caller and host.check_caller and caller != host.run_id:
            raise FailedPrecondition(f"called for run {caller!r}, but this {host.role.name} service "
                                     f"holds run {host.run_id!r}")
        return target

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        if _server_streaming(self._service, method):
            async def forward_stream(request, context):
                async for message in getattr(self._target(context), method)(request, context):
                    yield message

            return forward_stream

        async def forward(request, context):
            return await getattr(self._target(context), method)(request, context)

        return forward


def _server_streaming(service: str, method: str) -> bool:
    try:
        m = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(method)
    except KeyError:
        return False
    return m is not None and m.server_streaming
