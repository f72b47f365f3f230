"""Checks of the parallel layouts: each role's tensor x pipeline x expert x data split, and generation's.

Layouts that cannot work are refused before anything starts, with the numbers in the message:
degrees against services.<role>.world_size, rows per optimizer step against data-parallel ranks,
attention heads against TP (heads and experts come from model_file.py), generation TP and rollout
mode against the actor's layout.
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.model_file import attention_heads, check_moe, hf_config, num_experts
from tandem.config.schema import MegatronConfig, TandemConfig
from tandem.config.transformer_overrides import check_transformer_overrides

# megatron.dtype: the parameter dtypes a role trains in (bf16 keeps fp32 main weights in the optimizer;
# auto: bfloat16 on GPUs, float32 on CPUs, decided where the model is built).
DTYPES = ("auto", "float32", "bfloat16")


def check_parallel(cfg: TandemConfig) -> None:
    """The actor's and the critic's layouts, then generation's."""
    hf = hf_config(cfg.actor_rollout_ref.model)
    _check_role(cfg, "actor", "actor_rollout_ref.actor.megatron", cfg.actor_rollout_ref.actor.megatron, hf)
    _check_role(cfg, "critic", "critic.megatron", cfg.critic.megatron, hf)
    _check_generation(cfg)


def _check_role(cfg: TandemConfig, role: str, key: str, m: MegatronConfig, hf: dict | None) -> None:
    """One role's layout `m` (at dotted `key`) on services.<role>.world_size ranks."""
    tp, pp, ep = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.expert_model_parallel_size
    cp = m.context_parallel_size
    world = getattr(cfg.services, role).world_size
    check(m.dtype in DTYPES, f"{key}.dtype", f"{m.dtype!r}; known: {sorted(DTYPES)}")
    check(tp >= 1, f"{key}.tensor_model_parallel_size", "must be >= 1")
    check(pp >= 1, f"{key}.pipeline_model_parallel_size", "must be >= 1")
    check(ep >= 1, f"{key}.expert_model_parallel_size", "must be >= 1")
    check(cp >= 1, f"{key}.context_parallel_size", "must be >= 1")
    check(cp == 1 or ep == 1, f"{key}.context_parallel_size",
          f"{cp} with expert_model_parallel_size={ep}: context parallelism with experts is not offered yet")
    check(world >= 1 and world % (tp * pp * cp) == 0, f"services.{role}.world_size",
          f"{world} is not a multiple of tensor x pipeline x context parallel = {tp} x {pp} x {cp}")
    etp = m.expert_tensor_parallel_size
    check(etp is None or etp == tp or not num_experts(hf), f"{key}.expert_tensor_parallel_size",
          f"{etp}: Tandem splits experts over the role's tensor-parallel ranks (expert TP = "
          f"tensor_model_parallel_size={tp}); set {tp} or leave it unset")
    check(world >= 1 and world % (tp * pp * ep) == 0, f"services.{role}.world_size",
          f"{world} is not a multiple of tensor x pipeline x expert parallel = {tp} x {pp} x {ep}")
    check_transformer_overrides(key, m)
    check_moe(key, m, hf)
    check(role != "actor" or pp == 1 or not num_experts(hf), f"{key}.pipeline_model_parallel_size",
          f"{pp} with a mixture-of-experts actor_rollout_ref.model.path: its Hugging Face weights import at "
          "pipeline_model_parallel_size=1 only (tandem/convert/hf_load.py); use tensor or expert parallelism")
    dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 1
    n = cfg.actor_rollout_ref.rollout.n
    section = "actor_rollout_ref.actor" if role == "actor" else "critic"
    mini = (cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic).ppo_mini_batch_size
    rows = mini * n
    check(rows >= dp, f"{section}.ppo_mini_batch_size",
          f"{mini} prompts x rollout.n = {rows} rows per optimizer step < {dp} data-parallel ranks of the {role}")
    check(ep == 1 or rows % dp == 0, f"{section}.ppo_mini_batch_size",
          f"{mini} prompts x rollout.n = {rows} rows must split evenly over {dp} data-parallel ranks at "
          f"expert_model_parallel_size={ep} (expert all-to-alls run every rank in lockstep)")
    batch_rows = cfg.data.train_batch_size * n
    check(ep == 1 or batch_rows % dp == 0, "data.train_batch_size",
          f"{cfg.data.train_batch_size} prompts x rollout.n = {batch_rows} rows must split evenly over {dp} "
          f"data-parallel ranks of the {role} at expert_model_parallel_size={ep}")
    heads, groups = attention_heads(cfg.actor_rollout_ref.model, hf)
    check(heads % tp == 0 and groups % tp == 0, f"{key}.tensor_model_parallel_size",
          f"{tp} must divide num_attention_heads={heads} and num_key_value_heads={groups}")


def _check_generation(cfg: TandemConfig) -> None:
    """Where generation runs (rollout.mode, rollout.tensor_model_parallel_size) against the actor's layout."""
    a = cfg.actor_rollout_ref
    ep = a.actor.megatron.expert_model_parallel_size
    check(ep == 1 or a.rollout.mode == "standalone", "actor_rollout_ref.rollout.mode",
          f"{a.rollout.mode!r} with actor_rollout_ref.actor.megatron.expert_model_parallel_size={ep}: set "
          "standalone (a colocated rollout generates on each data-parallel rank on its own, but expert-parallel "
          "ranks must run every forward together)")
    rollout_tp, actor_tp = a.rollout.tensor_model_parallel_size, a.actor.megatron.tensor_model_parallel_size
    check(a.rollout.mode == "standalone" or rollout_tp in (None, 1, actor_tp),
          "actor_rollout_ref.rollout.tensor_model_parallel_size",
          f"{rollout_tp}: a colocated rollout generates at the actor's TP ({actor_tp}, null) or at 1 "
          "(a TP=1 copy on every rank)")
    check(cfg.services.rollout.world_size >= 1, "services.rollout.world_size", "must be >= 1")
    pp = a.actor.megatron.pipeline_model_parallel_size
    check(pp == 1 or a.rollout.mode == "standalone" or rollout_tp == 1,
          "actor_rollout_ref.rollout.tensor_model_parallel_size",
          f"{rollout_tp} with actor pipeline_model_parallel_size={pp}: generation does not run on "
          "pipeline stages; set 1 (a whole TP=1 copy on every rank) or rollout.mode=standalone")
