"""Checks of a standalone rollout: its own TP, its replicas, the weight plane (tandem/weights/),
and every service's GPU placement (devices, memory share).

A standalone rollout receives the actor's weights in the TP=1 layout and slices its own shard,
so its TP must divide the heads like any layout; a mixture-of-experts rollout runs at TP=1.
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.model_file import attention_heads, hf_config, num_experts
from tandem.config.schema import WEIGHT_TRANSPORTS, TandemConfig

ROLES = ("actor", "rollout", "critic", "reward")


def check_standalone_rollout(cfg: TandemConfig) -> None:
    """The rollout's own TP, its replicas and the weight plane's settings (standalone mode only)."""
    r, s = cfg.actor_rollout_ref.rollout, cfg.services
    if r.mode != "standalone":
        return
    hf = hf_config(cfg.actor_rollout_ref.model)
    tp, world, key = r.tensor_model_parallel_size or 1, s.rollout.world_size, "actor_rollout_ref.rollout"
    check(tp >= 1, f"{key}.tensor_model_parallel_size", "must be >= 1")
    check(world % tp == 0, "services.rollout.world_size",
          f"{world} is not a multiple of {key}.tensor_model_parallel_size={tp}")
    heads, groups = attention_heads(cfg.actor_rollout_ref.model, hf)
    check(heads % tp == 0 and groups % tp == 0, f"{key}.tensor_model_parallel_size",
          f"{tp} must divide num_attention_heads={heads} and num_key_value_heads={groups}")
    check(tp == 1 or not num_experts(hf), f"{key}.tensor_model_parallel_size",
          f"{tp}: a standalone rollout of a mixture-of-experts model runs at TP=1")
    w = r.weight_sync
    check(w.transport in WEIGHT_TRANSPORTS, f"{key}.weight_sync.transport",
          f"{w.transport!r}; known: {sorted(WEIGHT_TRANSPORTS)}")
    check(0 < w.chunk_mb <= 256, f"{key}.weight_sync.chunk_mb", f"{w.chunk_mb} must be in (0, 256] MiB")
    check(w.bucket_mb >= 1, f"{key}.weight_sync.bucket_mb", f"{w.bucket_mb} must be >= 1 MiB")
    check(1 <= w.streams <= 16, f"{key}.weight_sync.streams", f"{w.streams} must be in 1..16")
    check(w.timeout_s > 0, f"{key}.weight_sync.timeout_s", "must be > 0")
    bad = [h for h in w.store_hosts if not h or any(c.isspace() or c in "/@" for c in h)]
    check(not bad, f"{key}.weight_sync.store_hosts", f"{bad}: each must be a host name or IP address, no port")
    check(1 <= s.rollout.replicas <= 64, "services.rollout.replicas", f"{s.rollout.replicas} must be in 1..64")
    if s.rollout.endpoint:
        n = len(s.rollout.endpoint.split(","))
        check(n == s.rollout.replicas, "services.rollout.endpoint",
              f"{n} endpoints for services.rollout.replicas={s.rollout.replicas} (one host:port per replica, "
              "comma-separated)")


def check_devices(cfg: TandemConfig) -> None:
    """Replicas (rollout only), devices and GPU memory shares of every service."""
    for role in ROLES:
        svc, key = getattr(cfg.services, role), f"services.{role}"
        check(svc.replicas == 1 or (role == "rollout" and cfg.actor_rollout_ref.rollout.mode == "standalone"),
              f"{key}.replicas", f"{svc.replicas}: only a standalone rollout (actor_rollout_ref.rollout.mode="
              "standalone) runs as several replicas")
        f = svc.gpu_memory_fraction
        check(f is None or 0 < f <= 1, f"{key}.gpu_memory_fraction", f"{f} must be in (0, 1]")
        if svc.devices is not None:
            ids = str(svc.devices).split(",")
            check(all(i.strip().isdigit() for i in ids), f"{key}.devices",
                  f"{svc.devices!r} must be comma-separated GPU indices, e.g. '0' or '2,3'")
            every = svc.world_size * svc.replicas
            check(len(ids) in (svc.world_size, every), f"{key}.devices",
                  f"{len(ids)} GPUs for world_size={svc.world_size}: give one per rank (replicas take "
                  f"consecutive groups when {every} are given, else share them)")
