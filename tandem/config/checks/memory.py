"""Checks of the memory keys: verl's offload keys and megatron-core's CPU optimizer offload.

The offload keys (`megatron.{param,grad,optimizer}_offload`, `ref.megatron.param_offload`) are
booleans that combine freely (tandem/train/phases.py). `optim.override_optimizer_config` passes
megatron-core's CPU optimizer offload (HybridDeviceOptimizer: Adam for a fraction of the
parameters on the CPU) through, with the settings megatron-core needs for it: bf16 parameters
and the distributed optimizer in its precision-aware mode (the optimizer keeps the fp32 copies).
Whether the host has CUDA is the service's check (tandem/train/optim.py), not the config's.
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.schema import MegatronConfig, OptimConfig, TandemConfig

# optim.override_optimizer_config: the megatron-core OptimizerConfig fields Tandem passes through.
OPTIMIZER_OVERRIDE_KEYS = ("optimizer_cpu_offload", "optimizer_offload_fraction",
                           "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer")
_FLAGS = ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer")


def check_memory(cfg: TandemConfig) -> None:
    """The actor's and the critic's optimizer overrides against their megatron sections."""
    a = cfg.actor_rollout_ref.actor
    _check_optimizer_override("actor_rollout_ref.actor", a.optim, a.megatron)
    _check_optimizer_override("critic", cfg.critic.optim, cfg.critic.megatron)
    for name in ("param_offload", "grad_offload", "optimizer_offload"):  # reward_model.megatron shares the type
        check(not getattr(cfg.reward_model.megatron, name), f"reward_model.megatron.{name}",
              "the reward model is not offloaded (it is forward-only and lives in the reward service); set false")


def _check_optimizer_override(section: str, optim: OptimConfig, m: MegatronConfig) -> None:
    key = f"{section}.optim.override_optimizer_config"
    over = {k: v for k, v in optim.override_optimizer_config.items() if v is not None}  # null: megatron's default
    unknown = sorted(set(over) - set(OPTIMIZER_OVERRIDE_KEYS))
    check(not unknown, key, f"unknown keys {unknown}; Tandem passes through {list(OPTIMIZER_OVERRIDE_KEYS)}")
    for flag in _FLAGS:
        value = over.get(flag, False)
        check(isinstance(value, bool), f"{key}.{flag}", f"{value!r} must be true or false")
    fraction = over.get("optimizer_offload_fraction", 0.0)
    check(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction <= 1,
          f"{key}.optimizer_offload_fraction", f"{fraction!r} must be a number in [0, 1]")
    cpu = over.get("optimizer_cpu_offload", False)
    if not cpu:
        check(not over.get("use_precision_aware_optimizer", False), f"{key}.use_precision_aware_optimizer",
              "only with optimizer_cpu_offload=true (otherwise megatron-core needs Transformer Engine's "
              "FusedAdam, which Tandem does not use)")
        check(fraction == 0, f"{key}.optimizer_offload_fraction",
              f"{fraction} has no effect without optimizer_cpu_offload=true")
        check(not over.get("overlap_cpu_optimizer_d2h_h2d", False), f"{key}.overlap_cpu_optimizer_d2h_h2d",
              "has no effect without optimizer_cpu_offload=true")
        return
    check(fraction > 0, f"{key}.optimizer_offload_fraction",
          "0 keeps all of the optimizer on the GPU; set the share of parameters whose Adam runs on the CPU, in (0, 1]")
    check(m.dtype in ("bfloat16", "auto"), f"{section}.megatron.dtype",
          f"{m.dtype!r} with optimizer_cpu_offload: megatron-core's CPU optimizer offload trains bf16 "
          "parameters (it keeps their fp32 copies itself); set bfloat16")
    check(m.use_distributed_optimizer, f"{section}.megatron.use_distributed_optimizer",
          "must be true with optimizer_cpu_offload (megatron-core runs its CPU optimizer inside the "
          "distributed optimizer; on one GPU it is the whole optimizer)")
    check(over.get("use_precision_aware_optimizer", False), f"{key}.use_precision_aware_optimizer",
          "must be true with optimizer_cpu_offload (otherwise the distributed optimizer also keeps fp32 "
          "main weights on the GPU, the memory the offload is meant to free)")
