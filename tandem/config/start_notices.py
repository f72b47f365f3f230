"""What a run chooses for the user that depends on where it runs, said once at start."""
from __future__ import annotations

from tandem.config.schema import TandemConfig


def start_notices(cfg: TandemConfig, has_cuda: bool) -> list[str]:
    """One line per such choice (megatron.dtype auto: bfloat16 on GPUs, float32 on CPUs)."""
    roles = {"actor_rollout_ref.actor": cfg.actor_rollout_ref.actor.megatron}
    if cfg.algorithm.adv_estimator == "gae":
        roles["critic"] = cfg.critic.megatron
    if cfg.reward_model.enable:
        roles["reward_model"] = cfg.reward_model.megatron
    auto = [f"{role}.megatron.dtype" for role, m in roles.items() if m.dtype == "auto"]
    if not auto:
        return []
    chosen = "bfloat16 (GPUs here)" if has_cuda else "float32 (no GPU here; megatron-core's bf16 optimizer needs CUDA)"
    return [f"{', '.join(auto)}=auto -> {chosen}; set bfloat16 or float32 to choose"]
