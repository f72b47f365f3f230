"""The services section of the run's configuration (`services.*`): where each role's service runs,
how it is reached and secured. Part of tandem/config/schema.py's schema (re-exported there)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass
class RayPlacement:  # how the ray launcher places a service's ranks (one placement-group bundle per rank)
    num_cpus: float = 1.0  # CPUs per rank
    num_gpus: float = 0.0  # GPUs per rank (1 on GPU clusters)
    resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources per rank, e.g. {node_a: 0.01}
    strategy: Optional[str] = None  # PACK | STRICT_PACK | SPREAD | STRICT_SPREAD; None: STRICT_PACK at TP > 1, else SPREAD


@dataclass
class TLSConfig:  # TLS on a service's port (tandem/rpc/tls.py); one CA for the service and its callers
    enable: bool = False  # serve TLS on the role's port (docs/security.md)
    cert_file: Optional[str] = None  # the service's certificate chain, PEM (where the service is started)
    key_file: Optional[str] = None  # its private key, PEM
    ca_file: Optional[str] = None  # CA the caller checks the service against (None: system roots); client_auth: also the callers'
    client_auth: bool = False  # mutual TLS: the service requires a caller certificate signed by ca_file
    client_cert_file: Optional[str] = None  # the controller's certificate for mutual TLS
    client_key_file: Optional[str] = None  # its private key
    server_name: Optional[str] = None  # name the certificate is checked against (None: the endpoint's host)


@dataclass
class AuthConfig:  # bearer token on a service's port (tandem/rpc/auth.py); the token is never in the config
    token_file: Optional[str] = None  # a file holding the token
    token_env: Optional[str] = None  # or the name of an environment variable holding it
    health_without_token: bool = False  # grpc.health.v1 answers callers without a token


@dataclass
class ServiceEndpoint:
    endpoint: Optional[str] = None  # host:port of a running service to attach to; None = start one
    torch_threads: int = 1  # CPU threads of each rank (torch.set_num_threads; also the CPU optimizer's)
    world_size: int = 1  # ranks of the service: tensor x pipeline x data parallel
    replicas: int = 1  # rollout only: independent services the controller splits generation over
    devices: Optional[str] = None  # GPUs (CUDA_VISIBLE_DEVICES) of its ranks, e.g. "1" or "2,3"; replicas take consecutive groups
    gpu_memory_fraction: Optional[float] = None  # cap on each rank's share of its GPU (services sharing a GPU)
    host: str = "127.0.0.1"  # address a started service binds (0.0.0.0: every interface)
    tls: TLSConfig = field(default_factory=TLSConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    ray: RayPlacement = field(default_factory=RayPlacement)
    metrics_port: Optional[int] = None  # Prometheus /metrics of the service (rank 0, 127.0.0.1); 0 = any free port


@dataclass
class ServicesConfig:
    actor: ServiceEndpoint = field(default_factory=lambda: ServiceEndpoint(torch_threads=2))
    rollout: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    critic: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    reward: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    startup_timeout_s: float = 180.0  # seconds a started service may take to answer SERVING
    # a call's deadline before its duration is measured; measured ones (the model services') get at least a
    # tenth of it and at most all of it (tandem/rpc/deadlines.py): a hung service is restarted after that
    rpc_timeout_s: float = 600.0
    # Tandem's: torch.compile's on-disk caches (inductor, AOT autograd, triton kernels) under this
    # directory, kept across runs and restarts (tandem/serving/compile_cache.py); None: torch's default (/tmp)
    compile_cache_dir: str | None = None
    # started services may serve beyond loopback without a bearer token (--insecure); without it such a
    # service refuses to start (tandem/rpc/exposure.py)
    insecure: bool = False
