"""The CLI's client of the controller service (blocking gRPC; one call per command).

The address is `--controller HOST:PORT`, else $TANDEM_CONTROLLER, else 127.0.0.1:50050
(`tandem serve`'s default port). Failed calls raise the TandemError of their status.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

import grpc

from tandem.rpc.errors import error_from_rpc
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.v1 import controller_pb2, controller_pb2_grpc

ENV = "TANDEM_CONTROLLER"
DEFAULT_PORT = 50050


def controller_address(flag: str | None) -> str:
    return flag or os.environ.get(ENV) or f"127.0.0.1:{DEFAULT_PORT}"


def record_dict(r: controller_pb2.RunRecord) -> dict:
    return {"id": r.id, "state": r.state, "source": r.source, "overrides": list(r.overrides),
            "experiment": r.experiment, "created": r.created, "started": r.started, "finished": r.finished,
            "run_dir": r.run_dir, "last_step": r.last_step, "total_steps": r.total_steps,
            "summary": json.loads(r.summary_json) if r.summary_json else None, "error": r.error,
            "cancel_requested": r.cancel_requested, "resumed_from": r.resumed_from,
            "service_pids": json.loads(r.service_pids_json) if r.service_pids_json else {},
            "config_yaml": r.config_yaml}


def event_dict(e: controller_pb2.RunEvent) -> dict:
    kind = e.WhichOneof("kind")
    body = dict(e.metrics.values) if kind == "metrics" else getattr(e, kind)
    return {"seq": e.seq, "step": e.step, "time": e.time, "kind": kind, "body": body}


class ControllerClient:
    def __init__(self, address: str, timeout_s: float = 30.0, security: EndpointSecurity = PLAINTEXT):
        """security: the controller's TLS and token (`tandem serve --token-file ...`)."""
        self.address, self.timeout_s = address, timeout_s
        self._channel = security.sync_channel(address, [])
        self._stub = controller_pb2_grpc.ControllerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise error_from_rpc(e, f"ControllerService.{method} at {self.address}") from None

    def submit(self, config_yaml: str, overrides: list[str], source: str = "") -> dict:
        r = self._call("SubmitRun", controller_pb2.SubmitRunRequest(config_yaml=config_yaml, overrides=overrides,
                                                                     source=source))
        return record_dict(r.run)

    def get(self, run_id: str) -> tuple[dict, dict]:
        r = self._call("GetRun", controller_pb2.GetRunRequest(run_id=run_id))
        return record_dict(r.run), dict(r.latest_metrics)

    def list(self, limit: int = 0) -> list[dict]:
        return [record_dict(r) for r in self._call("ListRuns", controller_pb2.ListRunsRequest(limit=limit)).runs]

    def cancel(self, run_id: str) -> dict:
        return record_dict(self._call("CancelRun", controller_pb2.CancelRunRequest(run_id=run_id)).run)

    def events(self, run_id: str, from_step: int = 0, after_seq: int = 0, follow: bool = False) -> Iterator[dict]:
        """A run's events; with follow, until the run ends. Raises the TandemError of a broken stream."""
        request = controller_pb2.StreamEventsRequest(run_id=run_id, from_step=from_step, after_seq=after_seq,
                                                     follow=follow)
        try:
            for e in self._stub.StreamEvents(request, timeout=None if follow else self.timeout_s):
                yield event_dict(e)
        except grpc.RpcError as e:
            raise error_from_rpc(e, f"ControllerService.StreamEvents at {self.address}") from None
