"""Typed configuration for a run: one dataclass per section, verl's key names.

Loaded with OmegaConf (YAML file + dotted overrides). Unknown keys are errors that
name the nearest known keys; values are checked in `validate()` with the dotted key in
every message. Services read the same resolved file and take their own section.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from tandem.algos.advantages import ADV_ESTIMATORS


@dataclass
class ModelConfig:
    path: Optional[str] = None  # Hugging Face directory (Llama / Qwen2); None = the built-in shape below
    tokenizer_path: Optional[str] = None  # None = model.path, or the built-in character tokenizer
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 32
    rope_theta: float = 10000.0
    init_std: float = 0.02


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    clip_grad: float = 1.0
    lr_warmup_steps: int = 0


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1  # megatron-core's pipeline schedules (gloo p2p on CPU)
    use_distributed_optimizer: bool = False  # shard optimizer state over DP (megatron-core)
    sequence_parallel: bool = False  # split norms/activations along the sequence over TP (needs TP > 1)
    expert_model_parallel_size: int = 1  # MoE: experts split over EP ranks, carved out of DP (expert TP = TP)
    dtype: str = "float32"  # parameters: float32 | bfloat16 (bf16 keeps fp32 main weights in the optimizer)
    seed: int = 1
    # verl's key; only the MoE router load-balancing loss is read from it (OVERRIDE_KEYS below)
    override_transformer_config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # vanilla: token-level clipped PPO; gspo: sequence-level ratio


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4, lr_warmup_steps=10))
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    ppo_mini_batch_size: int = 128  # prompts per optimizer step (x rollout.n rows)
    ppo_micro_batch_size_per_gpu: int = 256  # rows per forward/backward
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    loss_agg_mode: str = "token-mean"
    tis_imp_ratio_cap: float = -1.0  # truncated IS with the rollout log-probs: weight min(ratio, cap); <= 0 = off
    # verl's key: torch.compile each transformer layer for training and log-probs (GPUs only;
    # tandem/models/compile.py). CPU runs stay eager.
    use_torch_compile: bool = True


@dataclass
class ValKwargsConfig:  # sampling for validation (verl: actor_rollout_ref.rollout.val_kwargs)
    n: int = 1
    do_sample: bool = False  # False = greedy (then n must be 1)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1


# actor_rollout_ref.rollout.weight_sync.transport values (tandem/weights/transport.py maps them)
WEIGHT_TRANSPORTS = ("auto", "stream", "ipc", "nccl", "collective")


@dataclass
class WeightSyncConfig:  # a standalone rollout's weight plane (tandem/weights/)
    transport: str = "auto"  # auto | stream | ipc | nccl (= collective; gloo on CPU)
    chunk_mb: float = 1.0  # stream: data bytes per gRPC message (MiB)
    streams: int = 2  # stream: parallel gRPC streams (each its own connection and thread) per sync
    bucket_mb: int = 256  # nccl: bytes per broadcast (MiB; the source's temporary bucket)
    timeout_s: float = 300.0  # a weight group's collectives and rendezvous


@dataclass
class RolloutConfig:
    mode: str = "colocated"  # colocated: the actor serves RolloutService; standalone: own service
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off (verl)
    max_batch_size: int = 512  # rows decoded together
    free_cache_engine: bool = False  # colocated: free the KV cache after each generation (verl's key)
    # generation TP (verl's key). None: colocated generates at the actor's TP on its modules;
    # 1: a TP=1 copy of the policy on every actor rank, synced before each generation
    # (tandem/rollout/replica.py). Standalone: the rollout's own TP (None = 1; its world size a
    # multiple of it; each rank slices its shard from the TP=1 weights it receives).
    tensor_model_parallel_size: int | None = None
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 64


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    ppo_mini_batch_size: int = 16
    ppo_micro_batch_size_per_gpu: int = 64
    ppo_epochs: int = 1
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    init_from_policy: bool = True  # trunk from the (SFT) policy, fresh value head
    use_torch_compile: bool = True  # as actor_rollout_ref.actor.use_torch_compile


@dataclass
class OverlongBufferConfig:  # DAPO overlong reward shaping (verl: reward_model.overlong_buffer)
    enable: bool = False
    len: int = 0  # the last `len` tokens before data.max_response_length are penalised linearly
    penalty_factor: float = 1.0
    log: bool = False  # accepted for verl parity; the metrics are always logged


@dataclass
class RewardModelConfig:
    default_rule: str = "arithmetic"  # rule for rows whose data_source names no rule
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class FilterGroupsConfig:  # DAPO dynamic sampling (verl: algorithm.filter_groups)
    enable: bool = False
    metric: str = "acc"  # acc (verifier score), score / seq_reward (after overlong shaping)
    max_num_gen_batches: int = 10  # <= 0: no bound


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class DataConfig:
    train_files: Optional[str] = None  # parquet/jsonl with verl's columns; None = built-in task
    val_files: Optional[str] = None
    train_batch_size: int = 128  # prompts per step
    gen_batch_size: Optional[int] = None  # prompts per generation round with filter_groups (None = train_batch_size)
    max_prompt_length: int = 16
    max_response_length: int = 6
    shuffle: bool = True
    seed: int = 1
    builtin_train_size: int = 20000
    builtin_val_size: int = 256


@dataclass
class SftConfig:
    total_steps: int = 1200  # 0 = no SFT warm start
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.0
    data_seed: int = 7


@dataclass
class TrainerConfig:
    project_name: str = "tandem"
    experiment_name: str = "arithmetic_grpo"
    total_training_steps: int = 120
    default_local_dir: str = "runs"
    logger: list = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    test_freq: int = 40  # validate every N steps (0 = only before and after RL)
    save_freq: int = 0  # checkpoint every N RL steps (0 = only at the end)
    resume_mode: str = "disable"  # disable | auto (latest checkpoint of this experiment) | resume_path
    resume_from_path: Optional[str] = None  # a checkpoints/global_step_N directory (resume_mode=resume_path)
    seed: int = 1
    sft: SftConfig = field(default_factory=SftConfig)


@dataclass
class ServiceEndpoint:
    endpoint: Optional[str] = None  # host:port of a running service to attach to; None = start one
    torch_threads: int = 1
    world_size: int = 1  # ranks of the service: tensor x pipeline x data parallel
    replicas: int = 1  # rollout only: independent services the controller splits generation over
    devices: Optional[str] = None  # GPUs (CUDA_VISIBLE_DEVICES) of its ranks, e.g. "1" or "2,3"; replicas take consecutive groups
    gpu_memory_fraction: Optional[float] = None  # cap on each rank's share of its GPU (services sharing a GPU)


@dataclass
class ServicesConfig:
    actor: ServiceEndpoint = field(default_factory=lambda: ServiceEndpoint(torch_threads=2))
    rollout: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    critic: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    reward: ServiceEndpoint = field(default_factory=ServiceEndpoint)
    startup_timeout_s: float = 180.0
    rpc_timeout_s: float = 600.0


@dataclass
class TandemConfig:
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)


class ConfigError(ValueError):
    """A bad config value or key; the message names the dotted key."""


def _known_keys(node, prefix="") -> list[str]:
    keys = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        keys.append(path)
        if OmegaConf.is_dict(v):
            keys.extend(_known_keys(v, path + "."))
    return keys


def _under_free_form(key: str, known: list[str]) -> bool:
    """A key inside a dict-valued section (override_transformer_config: checked by validate())."""
    head, _, rest = key.rpartition(".override_transformer_config.")
    return bool(rest) and f"{head}.override_transformer_config" in known


def _unknown_key(key: str, known: list[str]) -> ConfigError:
    near = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> TandemConfig:
    """Defaults <- YAML file <- dotted overrides; returns a validated TandemConfig."""
    base = OmegaConf.structured(TandemConfig)
    try:
        layers = [base]
        if path:
            layers.append(OmegaConf.load(path))
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"override {bad[0]!r} is not of the form key=value")
            known = _known_keys(base)
            for o in overrides:  # name the whole dotted key (OmegaConf names only its first unknown part)
                key = o.split("=", 1)[0].strip()
                if key not in known and not _under_free_form(key, known):
                    raise _unknown_key(key, known)
            layers.append(OmegaConf.from_dotlist(overrides))
        merged = OmegaConf.merge(*layers)
    except ConfigKeyError as e:  # an unknown key in the YAML file
        raise _unknown_key(str(getattr(e, "full_key", None) or e), _known_keys(base)) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"bad config value for {key!r}: {str(e).splitlines()[0]}") from None
    cfg: TandemConfig = OmegaConf.to_object(merged)
    validate(cfg)
    return cfg


def to_yaml(cfg: TandemConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


def validate(cfg: TandemConfig) -> None:
    a, d, t = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    estimators = sorted(ADV_ESTIMATORS)
    _check(cfg.algorithm.adv_estimator in estimators, "algorithm.adv_estimator",
           f"{cfg.algorithm.adv_estimator!r} is not available; known: {estimators}")
    _check(a.rollout.mode in ("colocated", "standalone"), "actor_rollout_ref.rollout.mode",
           f"{a.rollout.mode!r}; known: ['colocated', 'standalone']")
    _check(a.rollout.n >= 1, "actor_rollout_ref.rollout.n", "must be >= 1")
    _check(cfg.algorithm.adv_estimator not in ("grpo", "rloo", "reinforce_plus_plus_baseline")
           or a.rollout.n >= 2, "actor_rollout_ref.rollout.n",
           f"{cfg.algorithm.adv_estimator} needs at least 2 samples per prompt")
    _check(a.rollout.temperature > 0, "actor_rollout_ref.rollout.temperature", "must be > 0")
    _check(0 < a.rollout.top_p <= 1, "actor_rollout_ref.rollout.top_p", "must be in (0, 1]")
    _check(d.train_batch_size >= 1, "data.train_batch_size", "must be >= 1")
    _check(d.max_response_length >= 1, "data.max_response_length", "must be >= 1")
    _check(a.actor.ppo_mini_batch_size >= 1 and d.train_batch_size % a.actor.ppo_mini_batch_size == 0,
           "actor_rollout_ref.actor.ppo_mini_batch_size",
           f"{a.actor.ppo_mini_batch_size} must divide data.train_batch_size={d.train_batch_size}")
    _check(a.actor.loss_agg_mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                     "seq-mean-token-sum-norm"),
           "actor_rollout_ref.actor.loss_agg_mode", f"unknown mode {a.actor.loss_agg_mode!r}")
    _check(a.actor.policy_loss.loss_mode in ("vanilla", "gspo"), "actor_rollout_ref.actor.policy_loss.loss_mode",
           f"{a.actor.policy_loss.loss_mode!r}; known: ['gspo', 'vanilla']")
    _check(a.actor.clip_ratio_c > 1, "actor_rollout_ref.actor.clip_ratio_c", "must be > 1 (dual-clip bound)")
    _validate_parallel(cfg)
    _check(t.total_training_steps >= 0, "trainer.total_training_steps", "must be >= 0")
    _validate_issue4(cfg)
    unknown = set(t.logger) - {"console", "jsonl", "tensorboard"}
    _check(not unknown, "trainer.logger", f"unknown {sorted(unknown)}; known: console, jsonl, tensorboard")
    if a.model.path is not None:
        _check(os.path.isfile(os.path.join(a.model.path, "config.json")), "actor_rollout_ref.model.path",
               f"{a.model.path!r} is not a Hugging Face model directory (no config.json)")
    else:
        need = d.max_prompt_length + d.max_response_length
        _check(a.model.max_position_embeddings >= need, "actor_rollout_ref.model.max_position_embeddings",
               f"{a.model.max_position_embeddings} < data.max_prompt_length + data.max_response_length = {need}")


def _validate_issue4(cfg: TandemConfig) -> None:
    """TIS, DAPO (filter_groups, overlong buffer) and validation sampling."""
    a, d, alg = cfg.actor_rollout_ref, cfg.data, cfg.algorithm
    fg, ob, vk = alg.filter_groups, cfg.reward_model.overlong_buffer, a.rollout.val_kwargs
    _check(fg.metric in ("acc", "score", "seq_reward"), "algorithm.filter_groups.metric",
           f"{fg.metric!r}; known: ['acc', 'score', 'seq_reward']")
    _check(not fg.enable or a.rollout.n >= 2, "algorithm.filter_groups.enable",
           "dynamic sampling needs actor_rollout_ref.rollout.n >= 2 (a group of one always has equal rewards)")
    _check(d.gen_batch_size is None or d.gen_batch_size >= 1, "data.gen_batch_size", "must be >= 1")
    _check(not ob.enable or 0 < ob.len < d.max_response_length, "reward_model.overlong_buffer.len",
           f"{ob.len} must be in (0, data.max_response_length={d.max_response_length})")
    _check(ob.penalty_factor >= 0, "reward_model.overlong_buffer.penalty_factor", "must be >= 0")
    _check(vk.n >= 1, "actor_rollout_ref.rollout.val_kwargs.n", "must be >= 1")
    _check(vk.do_sample or vk.n == 1, "actor_rollout_ref.rollout.val_kwargs.n",
           f"{vk.n} greedy samples would all be equal; set val_kwargs.do_sample=true or n=1")
    _check(not vk.do_sample or vk.temperature > 0, "actor_rollout_ref.rollout.val_kwargs.temperature",
           "must be > 0 when val_kwargs.do_sample is true")
    _check(0 < vk.top_p <= 1, "actor_rollout_ref.rollout.val_kwargs.top_p", "must be in (0, 1]")
    _check(a.actor.tis_imp_ratio_cap <= 0 or a.actor.tis_imp_ratio_cap >= 1,
           "actor_rollout_ref.actor.tis_imp_ratio_cap",
           f"{a.actor.tis_imp_ratio_cap} must be >= 1 (a cap below 1 shrinks every on-policy token) or <= 0 (off)")


def _validate_parallel(cfg: TandemConfig) -> None:
    """Layouts that cannot work, before anything starts (heads are checked by each service)."""
    layouts = [("actor", "actor_rollout_ref.actor.megatron", cfg.actor_rollout_ref.actor.megatron),
               ("critic", "critic.megatron", cfg.critic.megatron)]
    hf = _hf_config(cfg.actor_rollout_ref.model)
    for role, key, m in layouts:
        tp, pp, ep = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.expert_model_parallel_size
        world = getattr(cfg.services, role).world_size
        _check(m.dtype in ("float32", "bfloat16"), f"{key}.dtype", f"{m.dtype!r}; known: ['bfloat16', 'float32']")
        _check(tp >= 1, f"{key}.tensor_model_parallel_size", "must be >= 1")
        _check(pp >= 1, f"{key}.pipeline_model_parallel_size", "must be >= 1")
        _check(ep >= 1, f"{key}.expert_model_parallel_size", "must be >= 1")
        _check(world >= 1 and world % (tp * pp * ep) == 0, f"services.{role}.world_size",
               f"{world} is not a multiple of tensor x pipeline x expert parallel = {tp} x {pp} x {ep}")
        _validate_moe(key, m, hf)
        dp = world // (tp * pp) if world % (tp * pp) == 0 else 1
        mini = (cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic).ppo_mini_batch_size
        rows = mini * cfg.actor_rollout_ref.rollout.n
        section = "actor_rollout_ref.actor" if role == "actor" else "critic"
        _check(rows >= dp, f"{section}.ppo_mini_batch_size",
               f"{mini} prompts x rollout.n = {rows} rows per optimizer step < {dp} data-parallel ranks of the {role}")
        _check(ep == 1 or rows % dp == 0, f"{section}.ppo_mini_batch_size",
               f"{mini} prompts x rollout.n = {rows} rows must split evenly over {dp} data-parallel ranks at "
               f"expert_model_parallel_size={ep} (expert all-to-alls run every rank in lockstep)")
        batch_rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        _check(ep == 1 or batch_rows % dp == 0, "data.train_batch_size",
               f"{cfg.data.train_batch_size} prompts x rollout.n = {batch_rows} rows must split evenly over {dp} "
               f"data-parallel ranks of the {role} at expert_model_parallel_size={ep}")
        heads, groups = _heads(cfg.actor_rollout_ref.model, hf)
        _check(heads % tp == 0 and groups % tp == 0, f"{key}.tensor_model_parallel_size",
               f"{tp} must divide num_attention_heads={heads} and num_key_value_heads={groups}")
    a = cfg.actor_rollout_ref
    _check(a.actor.megatron.expert_model_parallel_size == 1 or a.rollout.mode == "standalone",
           "actor_rollout_ref.rollout.mode",
           f"{a.rollout.mode!r} with actor_rollout_ref.actor.megatron.expert_model_parallel_size="
           f"{a.actor.megatron.expert_model_parallel_size}: set standalone (a colocated rollout generates on "
           "each data-parallel rank on its own, but expert-parallel ranks must run every forward together)")
    rollout_tp, actor_tp = a.rollout.tensor_model_parallel_size, a.actor.megatron.tensor_model_parallel_size
    _check(a.rollout.mode == "standalone" or rollout_tp in (None, 1, actor_tp),
           "actor_rollout_ref.rollout.tensor_model_parallel_size",
           f"{rollout_tp}: a colocated rollout generates at the actor's TP ({actor_tp}, null) or at 1 "
           "(a TP=1 copy on every rank)")
    rollout_world = cfg.services.rollout.world_size
    _check(rollout_world >= 1, "services.rollout.world_size", "must be >= 1")
    if a.rollout.mode == "standalone":
        _validate_standalone_rollout(cfg, hf)
    pp = a.actor.megatron.pipeline_model_parallel_size
    _check(pp == 1 or a.rollout.mode == "standalone" or rollout_tp == 1,
           "actor_rollout_ref.rollout.tensor_model_parallel_size",
           f"{rollout_tp} with actor pipeline_model_parallel_size={pp}: generation does not run on "
           "pipeline stages; set 1 (a whole TP=1 copy on every rank) or rollout.mode=standalone")
    _check(cfg.trainer.resume_mode in ("disable", "auto", "resume_path"), "trainer.resume_mode",
           f"{cfg.trainer.resume_mode!r}; known: ['auto', 'disable', 'resume_path']")
    _check(cfg.trainer.resume_mode != "resume_path" or bool(cfg.trainer.resume_from_path),
           "trainer.resume_from_path", "must be set when trainer.resume_mode=resume_path")
    _check(cfg.trainer.save_freq >= 0, "trainer.save_freq", "must be >= 0")
    _validate_services(cfg)


def _validate_standalone_rollout(cfg: TandemConfig, hf: Optional[dict]) -> None:
    """The rollout's own TP, its replicas and the weight plane (tandem/weights/)."""
    r, s = cfg.actor_rollout_ref.rollout, cfg.services
    tp, world, key = r.tensor_model_parallel_size or 1, s.rollout.world_size, "actor_rollout_ref.rollout"
    _check(tp >= 1, f"{key}.tensor_model_parallel_size", "must be >= 1")
    _check(world % tp == 0, "services.rollout.world_size",
           f"{world} is not a multiple of {key}.tensor_model_parallel_size={tp}")
    heads, groups = _heads(cfg.actor_rollout_ref.model, hf)
    _check(heads % tp == 0 and groups % tp == 0, f"{key}.tensor_model_parallel_size",
           f"{tp} must divide num_attention_heads={heads} and num_key_value_heads={groups}")
    _check(tp == 1 or not _num_experts(hf), f"{key}.tensor_model_parallel_size",
           f"{tp}: a standalone rollout of a mixture-of-experts model runs at TP=1")
    w = r.weight_sync
    _check(w.transport in WEIGHT_TRANSPORTS, f"{key}.weight_sync.transport",
           f"{w.transport!r}; known: {sorted(WEIGHT_TRANSPORTS)}")
    _check(0 < w.chunk_mb <= 256, f"{key}.weight_sync.chunk_mb", f"{w.chunk_mb} must be in (0, 256] MiB")
    _check(w.bucket_mb >= 1, f"{key}.weight_sync.bucket_mb", f"{w.bucket_mb} must be >= 1 MiB")
    _check(1 <= w.streams <= 16, f"{key}.weight_sync.streams", f"{w.streams} must be in 1..16")
    _check(w.timeout_s > 0, f"{key}.weight_sync.timeout_s", "must be > 0")
    _check(1 <= s.rollout.replicas <= 64, "services.rollout.replicas", f"{s.rollout.replicas} must be in 1..64")
    if s.rollout.endpoint:
        n = len(s.rollout.endpoint.split(","))
        _check(n == s.rollout.replicas, "services.rollout.endpoint",
               f"{n} endpoints for services.rollout.replicas={s.rollout.replicas} (one host:port per replica, "
               "comma-separated)")


def _validate_services(cfg: TandemConfig) -> None:
    """Replicas (rollout only), devices and GPU memory shares of every service."""
    for role in ("actor", "rollout", "critic", "reward"):
        svc, key = getattr(cfg.services, role), f"services.{role}"
        _check(svc.replicas == 1 or (role == "rollout" and cfg.actor_rollout_ref.rollout.mode == "standalone"),
               f"{key}.replicas", f"{svc.replicas}: only a standalone rollout (actor_rollout_ref.rollout.mode="
               "standalone) runs as several replicas")
        f = svc.gpu_memory_fraction
        _check(f is None or 0 < f <= 1, f"{key}.gpu_memory_fraction", f"{f} must be in (0, 1]")
        if svc.devices is not None:
            ids = str(svc.devices).split(",")
            _check(all(i.strip().isdigit() for i in ids), f"{key}.devices",
                   f"{svc.devices!r} must be comma-separated GPU indices, e.g. '0' or '2,3'")
            every = svc.world_size * svc.replicas
            _check(len(ids) in (svc.world_size, every), f"{key}.devices",
                   f"{len(ids)} GPUs for world_size={svc.world_size}: give one per rank (replicas take "
                   f"consecutive groups when {every} are given, else share them)")


# The override_transformer_config keys Tandem reads (verl passes any TransformerConfig field through;
# here the layer spec and numerics are fixed by the model, so other keys are refused, not ignored).
LOAD_BALANCING_TYPES = ("none", "aux_loss")
OVERRIDE_KEYS = ("moe_router_load_balancing_type", "moe_aux_loss_coeff")


def _validate_moe(key: str, m: MegatronConfig, hf: Optional[dict]) -> None:
    """Expert parallelism and the router load-balancing loss against the model's experts."""
    ep, tp = m.expert_model_parallel_size, m.tensor_model_parallel_size
    experts = _num_experts(hf)
    over = m.override_transformer_config
    unknown = sorted(set(over) - set(OVERRIDE_KEYS))
    _check(not unknown, f"{key}.override_transformer_config",
           f"unsupported keys {unknown}; supported: {list(OVERRIDE_KEYS)}")
    kind = over.get("moe_router_load_balancing_type")
    _check(kind is None or kind in LOAD_BALANCING_TYPES,
           f"{key}.override_transformer_config.moe_router_load_balancing_type",
           f"{kind!r}; supported: {list(LOAD_BALANCING_TYPES)} (seq_aux_loss / global_aux_loss / sinkhorn "
           "are not: micro-batches are packed rows)")
    coeff = over.get("moe_aux_loss_coeff")
    _check(coeff is None or (isinstance(coeff, (int, float)) and not isinstance(coeff, bool) and coeff >= 0),
           f"{key}.override_transformer_config.moe_aux_loss_coeff", f"{coeff!r} must be a number >= 0")
    if not experts:
        _check(ep == 1, f"{key}.expert_model_parallel_size",
               f"{ep} needs a mixture-of-experts model (actor_rollout_ref.model.path with num_experts); "
               "this model is dense")
        _check(kind in (None, "none") and not coeff, f"{key}.override_transformer_config",
               "a router load-balancing loss needs a mixture-of-experts model; this model is dense")
        return
    _check(experts % ep == 0, f"{key}.expert_model_parallel_size",
           f"{ep} must divide num_experts={experts} (actor_rollout_ref.model.path config.json)")
    _check(tp == 1 or m.sequence_parallel, f"{key}.sequence_parallel",
           f"must be true for a mixture-of-experts model at tensor_model_parallel_size={tp} "
           "(megatron-core trains MoE layers under TP only with sequence parallelism)")


def router_aux_loss_coeff(m: MegatronConfig, model: ModelConfig) -> float:
    """The MoE router load-balancing loss coefficient a role trains with (0.0: off).

    Like transformers, which adds router_aux_loss_coef x its loss only when config.json sets
    output_router_logits: on by default exactly then (verl's mbridge leaves it off for RL);
    override_transformer_config.moe_router_load_balancing_type (none | aux_loss) and
    .moe_aux_loss_coeff (default: router_aux_loss_coef, else 0.001) decide otherwise."""
    hf = _hf_config(model)
    if not _num_experts(hf):
        return 0.0
    over = m.override_transformer_config
    coeff = float(over.get("moe_aux_loss_coeff", hf.get("router_aux_loss_coef", 0.001)))
    kind = over.get("moe_router_load_balancing_type")
    if kind is None:
        kind = "aux_loss" if ("moe_aux_loss_coeff" in over or hf.get("output_router_logits")) else "none"
    return coeff if kind == "aux_loss" else 0.0


def _hf_config(model: ModelConfig) -> Optional[dict]:
    """model.path's config.json, or None for the built-in shape (a bad path is reported on its own)."""
    if model.path is None or not os.path.isfile(os.path.join(model.path, "config.json")):
        return None
    import json

    with open(os.path.join(model.path, "config.json")) as f:
        return json.load(f)


def _num_experts(hf: Optional[dict]) -> int:
    """Routed experts of a config.json (0: dense); transformers 5 spells it num_local_experts."""
    if not hf:
        return 0
    return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


def _heads(model: ModelConfig, hf: Optional[dict]) -> tuple[int, int]:
    """(attention heads, key/value heads) of the built-in shape or of model.path's config.json."""
    if hf is None:
        return model.num_attention_heads, model.num_key_value_heads
    heads = int(hf.get("num_attention_heads", 1))
    return heads, int(hf.get("num_key_value_heads") or heads)
