"""The run's configuration schema: one dataclass per section, verl's key names.

Keys, defaults and the comment with each field are the reference for what a key means:
docs/config-reference.md is generated from them (python -m tandem.config.reference_doc). Loading and merging are in load.py; value checks
in checks/ and model_file.py. Nothing here reads files or checks values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from tandem.config.services_schema import (  # noqa: F401  (re-exported: part of the schema)
    AuthConfig,
    RayPlacement,
    ServiceEndpoint,
    ServicesConfig,
    TLSConfig,
)


@dataclass
class ModelConfig:
    # a local Hugging Face directory (Llama, Mistral without sliding window, Qwen2, Qwen3, Qwen3-MoE: safetensors,
    # config.json, a tokenizer unless tokenizer_path): policy, reference and rollout start from it; None: the
    # built-in shape below
    path: Optional[str] = None
    tokenizer_path: Optional[str] = None  # None = model.path, or the built-in character tokenizer
    hidden_size: int = 64  # the built-in shape (used without model.path): width
    num_hidden_layers: int = 4  # built-in shape: transformer layers
    num_attention_heads: int = 4  # built-in shape: query heads
    num_key_value_heads: int = 2  # built-in shape: key/value heads (GQA groups)
    intermediate_size: int = 256  # built-in shape: SwiGLU hidden width
    max_position_embeddings: int = 32  # built-in shape: longest prompt + response
    rope_theta: float = 10000.0  # built-in shape: RoPE base
    init_std: float = 0.02  # built-in shape: std of the random initialisation


@dataclass
class OptimConfig:
    lr: float = 1e-4  # peak learning rate of AdamW (megatron-core's Adam with decoupled weight decay)
    weight_decay: float = 0.0  # decoupled weight decay (constant)
    betas: list = field(default_factory=lambda: [0.9, 0.999])  # Adam's beta1, beta2
    clip_grad: float = 1.0  # global gradient-norm clip
    lr_warmup_steps: int = 0  # warmup steps from lr_warmup_init to lr; < 0: lr_warmup_steps_ratio x the decay steps
    # verl's LR schedule keys, run by megatron-core's OptimizerParamScheduler (tandem/train/optim.py). They count
    # training steps, as verl's; the LR moves at every optimizer step (mini-batch) along that curve
    lr_warmup_steps_ratio: float = 0.0  # warmup as a fraction of the decay steps, when lr_warmup_steps < 0
    lr_warmup_init: float = 0.0  # LR at the start of warmup
    lr_decay_steps: Optional[int] = None  # steps of warmup + decay; None: trainer.total_training_steps
    lr_decay_style: str = "constant"  # after warmup: constant | linear | cosine | inverse-square-root | WSD
    min_lr: float = 0.0  # the LR the decay ends at
    lr_wsd_decay_style: str = "exponential"  # WSD's final decay: exponential | linear | cosine
    lr_wsd_decay_steps: Optional[int] = None  # WSD: steps of the final decay
    # verl's key: megatron-core OptimizerConfig fields; Tandem takes its CPU optimizer offload
    # (HybridDeviceOptimizer): optimizer_cpu_offload, optimizer_offload_fraction,
    # overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer (checks/memory.py)
    override_optimizer_config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = 1  # TP; DP = services.<role>.world_size / (TP x PP x CP)
    # CP: each packed micro-batch's tokens split over CP ranks (zig-zag chunks; keys and values all-gathered
    # per layer): long rows' activations shrink by CP (docs/parallelism.md)
    context_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1  # megatron-core's pipeline schedules (gloo p2p on CPU)
    use_distributed_optimizer: bool = False  # shard optimizer state over DP (megatron-core)
    sequence_parallel: bool = True  # split norms/activations along the sequence over TP (only at TP > 1)
    expert_model_parallel_size: int = 1  # MoE: experts split over EP ranks, carved out of DP x TP (docs/parallelism.md)
    expert_tensor_parallel_size: Optional[int] = None  # MoE: None or tensor_model_parallel_size (expert TP = TP)
    # parameters: float32 | bfloat16 (bf16 keeps fp32 main weights in the optimizer) | auto (bfloat16 on GPUs,
    # float32 on CPUs: tandem/parallel/device.py decides where the model is built)
    dtype: str = "auto"
    seed: int = 1  # the model's initialisation seed (built-in shape) and megatron's RNG
    # verl's offload keys (tandem/train/phases.py): while the role runs a phase that does not use
    # them, parameters wait in pinned host memory, gradient buffers are dropped, optimizer state
    # (fp32 main weights, Adam moments) waits in pinned host memory
    param_offload: bool = False  # the weights (docs/memory.md)
    grad_offload: bool = False  # the fp32 gradient buffer, outside training
    optimizer_offload: bool = False  # fp32 main weights and Adam moments, outside training
    # verl's key: megatron-core TransformerConfig fields; the ones that apply to Tandem's layer spec are
    # passed through (activation recomputation, ...), the MoE router loss is read by Tandem, the rest
    # are refused naming why (tandem/config/transformer_overrides.py)
    override_transformer_config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # vanilla: token-level clipped PPO; gspo: sequence-level ratio


@dataclass
class ProfileConfig:  # verl's `profile` keys (torch.profiler): tandem/serving/call_observer.py
    use_profile: bool = False  # a torch.profiler trace per step (Chrome JSON): docs/performance.md
    profile_ranks: Optional[List[int]] = None  # the service's ranks to trace; None: [0] (verl's)
    step_start: int = -1  # trace RL steps step_start <= step < step_end (steps count from 1)
    step_end: int = -1  # see step_start
    save_path: Optional[str] = None  # None: <run dir>/profile; a relative path: under the run dir


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4, lr_warmup_steps=10))
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    ppo_mini_batch_size: int = 128  # prompts per optimizer step (x rollout.n rows)
    ppo_micro_batch_size_per_gpu: Optional[int] = None  # rows per forward/backward (set: rows, not a budget)
    # verl's: micro-batches by a token budget instead of rows: the fewest runs of consecutive rows of at
    # most ppo_max_token_len_per_gpu real tokens each, balanced (tandem/train/microbatch.py); the update,
    # SFT and the old log-prob pass. Same results as any other split; the budget must hold the longest row.
    # null: a budget unless ppo_micro_batch_size_per_gpu is set or experts are parallel (tandem/config/resolve.py)
    use_dynamic_bsz: Optional[bool] = None
    ppo_max_token_len_per_gpu: int = 32768  # the token budget of a micro-batch (use_dynamic_bsz)
    ppo_epochs: int = 1  # passes over each batch
    shuffle: bool = False  # shuffle rows between mini-batches (seeded by trainer.seed)
    clip_ratio: float = 0.2  # PPO clip
    clip_ratio_low: Optional[float] = None  # lower clip (None: clip_ratio)
    clip_ratio_high: Optional[float] = None  # upper clip, DAPO's clip-higher (None: clip_ratio)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    entropy_coeff: float = 0.0  # entropy bonus
    use_kl_loss: bool = False  # KL to the reference as a loss term
    kl_loss_coef: float = 0.001  # its coefficient
    kl_loss_type: str = "low_var_kl"  # its estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3)
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    tis_imp_ratio_cap: float = -1.0  # truncated IS with the rollout log-probs: weight min(ratio, cap); <= 0 = off
    # verl's key: torch.compile each transformer layer for training and log-probs (GPUs only; CPU runs stay eager)
    use_torch_compile: bool = True
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class ValKwargsConfig:  # sampling for validation (verl: actor_rollout_ref.rollout.val_kwargs)
    n: int = 1  # samples per validation prompt (mean@n, best@n, maj@n per data_source)
    do_sample: bool = False  # False = greedy (then n must be 1)
    temperature: float = 0.0  # with do_sample
    top_p: float = 1.0  # with do_sample
    top_k: int = -1  # with do_sample (-1: off)


# actor_rollout_ref.rollout.weight_sync.transport values (tandem/weights/transport.py maps them)
WEIGHT_TRANSPORTS = ("auto", "stream", "ipc", "nccl", "collective")


@dataclass
class WeightSyncConfig:  # a standalone rollout's weight plane (tandem/weights/)
    transport: str = "auto"  # auto | stream | ipc | nccl (= collective; gloo on CPU)
    chunk_mb: float = 1.0  # stream: data bytes per gRPC message (MiB)
    streams: int = 2  # stream: parallel gRPC streams (each its own connection and thread) per sync
    bucket_mb: int = 256  # nccl: bytes per broadcast (MiB; the source's temporary bucket)
    timeout_s: float = 300.0  # a weight group's collectives and rendezvous (at most 600: the source's cap)
    store_hosts: list[str] = field(default_factory=list)  # the actor: rendezvous hosts it joins besides a caller's own


@dataclass
class MultiTurnConfig:  # verl's rollout.multi_turn keys (tandem/generation/multi_turn.py, tandem/rollout/tools.py)
    enable: bool = False  # rows call tools between turns; observations are in the response, not in its loss
    max_assistant_turns: Optional[int] = None  # model turns per row (null: as many as the response length allows)
    tool_config_path: Optional[str] = None  # verl's tool-config YAML (null: the built-in in-process calculator)
    max_parallel_calls: int = 1  # calls of one turn that are run (the rest are dropped)
    max_tool_response_length: int = 256  # characters of a tool's answer kept
    tool_response_truncate_side: str = "middle"  # left | right | middle
    format: str = "auto"  # tool-call format: hermes (<tool_call> JSON), calculator (the built-in task); auto: the tokenizer's
    tool_timeout_s: float = 30.0  # a call's deadline, then an error observation (a tool config's timeout_s wins)
    tool_retries: int = 1  # attempts after a timeout or a failed call (tool services: after UNAVAILABLE)
    interaction_config_path: Optional[str] = None  # verl's interaction-config YAML: EnvironmentServices rows play
    max_user_turns: Optional[int] = None  # observations per row, tool answers and environment turns (null: no limit)


@dataclass
class RolloutConfig:
    mode: str = "colocated"  # colocated: the actor serves RolloutService; standalone: own service
    n: int = 8  # samples per prompt
    temperature: float = 1.0  # sampling temperature (rollout log-probs are of logits / temperature)
    top_p: float = 1.0  # nucleus sampling (1.0: off)
    top_k: int = -1  # -1 = off (verl)
    max_batch_size: int = 512  # rows decoded together
    free_cache_engine: bool = False  # colocated: free the KV cache after each generation (verl's key)
    # generation TP (verl's key). None: colocated generates at the actor's TP on its modules; 1: a TP=1
    # copy of the policy on every actor rank, synced before each generation (tandem/rollout/replica.py).
    # Standalone: the rollout's own TP (None = 1; its world size a multiple of it; each rank slices its shard).
    tensor_model_parallel_size: int | None = None
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)  # standalone: the rollout service's


@dataclass
class RefMegatronConfig:  # the reference shares the actor's layout; verl's offload key only
    param_offload: bool = False  # the reference in pinned host memory except during ref log-probs


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 64  # rows per reference forward
    log_prob_use_dynamic_bsz: Optional[bool] = None  # the reference pass's token budget (None: the actor's keys)
    log_prob_max_token_len_per_gpu: Optional[int] = None  # its token budget (None: the actor's)
    megatron: RefMegatronConfig = field(default_factory=RefMegatronConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)  # the reference lives in the actor service


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
    ppo_mini_batch_size: int = 16  # prompts per critic optimizer step
    ppo_micro_batch_size_per_gpu: int = 64  # rows per critic forward/backward
    use_dynamic_bsz: bool = False  # as the actor's: token budgets for the update and the values pass
    ppo_max_token_len_per_gpu: int = 32768  # the update's token budget (use_dynamic_bsz)
    forward_max_token_len_per_gpu: int = 32768  # the values pass's token budget (use_dynamic_bsz)
    ppo_epochs: int = 1  # passes over each batch
    cliprange_value: float = 0.5  # clipped value loss
    loss_agg_mode: str = "token-mean"  # as the actor's
    init_from_policy: bool = True  # trunk from the (SFT) policy, fresh value head
    use_torch_compile: bool = True  # as actor_rollout_ref.actor.use_torch_compile
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class OverlongBufferConfig:  # DAPO overlong reward shaping (verl: reward_model.overlong_buffer)
    enable: bool = False  # penalise responses near data.max_response_length
    len: int = 0  # the last `len` tokens before data.max_response_length are penalised linearly
    penalty_factor: float = 1.0  # the penalty at the length limit is -penalty_factor
    log: bool = False  # accepted for verl parity; the metrics are always logged


@dataclass
class RewardModelPathConfig:  # verl: reward_model.model
    path: Optional[str] = None  # a Hugging Face LlamaForSequenceClassification / Qwen2ForSequenceClassification directory


@dataclass
class RewardModelConfig:
    default_rule: str = "arithmetic"  # rule for rows whose data_source names no rule
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # a model-based reward hosted by the reward service (verl's keys); it reads the policy's token ids
    enable: bool = False
    model: RewardModelPathConfig = field(default_factory=RewardModelPathConfig)
    micro_batch_size_per_gpu: int = 16  # rows per reward-model forward
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # the reward model's layout and dtype
    rule_coef: float = 0.0  # with enable: score = model score + rule_coef x rule (or custom function) score
    # calling the reward service (the controller's side)
    timeout_s: float = 300.0  # deadline of one Score call
    max_retries: int = 3  # retries of a call answered UNAVAILABLE / RESOURCE_EXHAUSTED, with backoff
    retry_backoff_s: float = 0.5  # first wait; doubles per retry
    on_failure: str = "fail"  # a row that could not be scored: fail (the step fails) | drop (its prompt group)


@dataclass
class CustomRewardFunctionConfig:  # verl: custom_reward_function; run by the reward service
    path: Optional[str] = None  # a Python file defining compute_score(data_source, solution_str, ground_truth, extra_info)
    name: str = "compute_score"  # the function's name in that file
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)  # extra keyword arguments of each call
    timeout_s: float = 10.0  # per row; a call past it is killed and the row fails
    num_workers: int = 2  # processes of the pool the function runs in


@dataclass
class KLCtrlConfig:
    type: str = "fixed"  # fixed | adaptive KL controller of the KL in the reward
    kl_coef: float = 0.001  # initial (fixed: constant) coefficient
    target_kl: float = 0.1  # adaptive: the KL it steers toward
    horizon: int = 10000  # adaptive: steps over which it adapts


@dataclass
class FilterGroupsConfig:  # DAPO dynamic sampling (verl: algorithm.filter_groups)
    enable: bool = False  # drop prompt groups whose metric is equal for every sample; generate more
    metric: str = "acc"  # acc (verifier score), score / seq_reward (after overlong shaping)
    max_num_gen_batches: int = 10  # <= 0: no bound


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | gae (PPO, a critic service) | rloo | reinforce_plus_plus(_baseline) | remax
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda
    norm_adv_by_std_in_grpo: bool = True  # divide GRPO advantages by the group's std
    use_kl_in_reward: bool = False  # subtract KL to the reference from the reward
    kl_penalty: str = "kl"  # its estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3)
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class DataConfig:
    train_files: Any = None  # a parquet/jsonl file in verl's schema, or a list of them; None = built-in task
    val_files: Any = None  # the same for validation; None = built-in task
    prompt_key: str = "prompt"  # the column with the chat messages (or a plain string)
    reward_fn_key: str = "data_source"  # the column that picks the reward rule
    filter_overlong_prompts: bool = True  # drop prompts over max_prompt_length; false: apply `truncation`
    truncation: str = "error"  # error | left | right | middle: an overlong prompt when not filtered
    train_max_samples: int = -1  # use the first N rows only (-1: all)
    val_max_samples: int = -1  # the same for validation
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # e.g. {enable_thinking: false}
    train_batch_size: int = 128  # prompts per step
    gen_batch_size: Optional[int] = None  # prompts per generation round with filter_groups (None = train_batch_size)
    max_prompt_length: int = 16  # tokens; longer prompts are filtered (or truncated)
    max_response_length: int = 6  # new tokens per response
    shuffle: bool = True  # shuffled epochs (the cursor is saved in controller_state.json)
    seed: int = 1  # the shuffle's seed; also draws the built-in data and the SFT dev split
    builtin_train_size: int = 20000  # built-in task (no train_files): training problems, sums of a, b in 0..999
    builtin_val_size: int = 256  # built-in task: validation problems
    builtin_fixed_width: bool = True  # built-in task: `012+345=` -> `0357` (false: `12+345=` -> `357`)
    # built-in task: add (3-digit sums) or mul_tool (3-digit products with a calculator tool, which the rollout
    # answers with actor_rollout_ref.rollout.multi_turn.enable=true; tandem/tasks/calculator_tool.py)
    builtin_task: str = "add"


@dataclass
class SftConfig:
    # 0 = no SFT warm start; with stop_at_accuracy: the most steps. "auto": 4000 on the built-in task,
    # 0 on your data (data.train_files: verl runs no warm start), resolved with the run directory
    total_steps: Any = "auto"
    batch_size: int = 128  # rows per SFT step (cross-entropy on ground_truth + EOS)
    lr: float = 3e-3  # its own AdamW
    weight_decay: float = 0.0  # its own AdamW
    data_seed: int = 7  # order of the SFT rows
    # Stop the warm start at the first greedy accuracy >= this on a dev split held out of the
    # training data (dev_size prompts, never trained on; not the reported validation set),
    # measured every eval_freq steps. None: run total_steps, no dev split. "auto": 0.4 on the
    # built-in task, None on your data (data.train_files), resolved when the run directory is made.
    stop_at_accuracy: Any = "auto"  # a float in (0, 1], None or "auto" (checks/trainer.py)
    eval_freq: int = 10  # SFT steps between dev-split measurements
    dev_size: int = 256  # prompts held out for stop_at_accuracy (seeded by data.seed)


@dataclass
class TrainerConfig:
    project_name: str = "tandem"  # for wandb and mlflow
    experiment_name: str = "arithmetic_grpo"  # run directories are <default_local_dir>/<experiment>-<time>
    total_training_steps: Optional[int] = 120  # None: total_epochs x full batches per epoch (verl's rule)
    total_epochs: Optional[int] = None  # with total_training_steps unset: passes over data.train_files
    critic_warmup: int = 0  # the first N steps update only the critic (verl's key)
    log_val_generations: int = 0  # log the first N validation samples (prompt, response, score) per validation
    default_local_dir: str = "runs"  # where run directories go
    logger: list = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])  # + wandb, mlflow, swanlab
    test_freq: int = 40  # validate every N steps (0 = only before and after RL)
    val_before_train: bool = True  # validate before RL (step 0, after the warm start); verl's key
    # checkpoint every N RL steps and at the last (<= 0: none, as in verl); with max_restarts > 0 also
    # after the warm start (global_step_0). A crash loses at most N steps of work; each save costs a write.
    save_freq: int = 10
    # the newest N complete checkpoints kept, older ones removed once a newer one is complete (None: all);
    # verl's max_actor_ckpt_to_keep / max_critic_ckpt_to_keep (one checkpoint holds both roles here)
    max_ckpt_to_keep: Optional[int] = None
    max_restarts: int = 3  # services restarted after a crash (then the run stops); 0 = no recovery
    resume_mode: str = "disable"  # disable | auto (latest checkpoint of this experiment) | resume_path
    resume_from_path: Optional[str] = None  # a checkpoints/global_step_N directory (resume_mode=resume_path)
    # a run of the controller service (`tandem submit`) that was running when its controller died:
    # resume (from its latest checkpoint, or from the start without one) or fail
    on_controller_restart: str = "resume"
    seed: int = 1  # controller-side randomness (mini-batch shuffles)
    sft: SftConfig = field(default_factory=SftConfig)
    launcher: str = "local"  # who starts the services: local (child processes) | compose | ray (controller/launchers/)


ASYNC_MODES = ("sync", "one_step_off", "fully_async")  # async_training.mode (controller/async_loop.py)
ON_STALE = ("wait", "drop", "regenerate")  # async_training.on_stale


@dataclass
class AsyncTrainingConfig:  # generation overlapping training (verl: the fully-async recipe's async_training)
    mode: str = "sync"  # sync | one_step_off (staleness 1, one batch ahead) | fully_async (the keys below)
    staleness_threshold: int = 1  # max weight versions between a batch's generation and its update (verl: a fraction)
    max_inflight_batches: int = 2  # fully_async: batches generated ahead of the one being trained
    on_stale: str = "wait"  # wait: no batch is started that would be stale; drop | regenerate a stale one


@dataclass
class TandemConfig:
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
