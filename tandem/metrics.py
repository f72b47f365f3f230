"""Prometheus helpers: per-RPC counters and latency histograms.

`RpcMetrics` owns its metrics in its own CollectorRegistry (so several
servers can live in one process, e.g. in tests); `start_metrics_server`
exposes a registry over HTTP. Nothing is registered at import time.
"""

from __future__ import annotations

import prometheus_client as prom

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class RpcMetrics:
    """tandem_rpc_total{role,method,code} and tandem_rpc_seconds{role,method}."""

    def __init__(self, role: str, registry: prom.CollectorRegistry | None = None):
        self.role = role
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.calls = prom.Counter("tandem_rpc", "RPCs handled, by method and status code",
                                  ["role", "method", "code"], registry=self.registry)
        self.latency = prom.Histogram("tandem_rpc_seconds", "RPC handling time in seconds",
                                      ["role", "method"], buckets=_LATENCY_BUCKETS,
                                      registry=self.registry)

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.calls.labels(self.role, method, code).inc()
        self.latency.labels(self.role, method).observe(seconds)


def start_metrics_server(port: int, registry: prom.CollectorRegistry, addr: str = "127.0.0.1"):
    """Serve `registry` at http://addr:port/metrics in a daemon thread. Plain HTTP with no
    authentication, so loopback by default (gRPC ports have TLS and tokens; this one does not).

    Returns the WSGI server (call .shutdown() to stop; .server_port is the
    bound port, useful with port=0).
    """
    httpd, _thread = prom.start_http_server(port, addr=addr, registry=registry)
    return httpd
