"""verl's Megatron trainer keys that Tandem does not have under the same name: what each becomes.

Every leaf key of verl's ppo_megatron_trainer config (listed with its default in verl_defaults.yaml)
is one of:

- honoured: Tandem has the key with verl's meaning (tandem/config/schema.py; not listed here), or
  the key is listed here as `refused` and its value is one Tandem already behaves as (verl's
  default, or an `accept` value): e.g. `megatron.param_offload=false`;
- mapped: it becomes a Tandem key (`apply` returns the Tandem keys to set) or is covered by a
  Tandem mechanism with nothing to set (`apply` None); the loader prints one notice per mapped key;
- refused: "verl key X is not supported by Tandem (why, or what to use instead)".

Rules are matched in order, first match wins (`*` matches any characters, dots included). A rule
with `when` applies only to values it accepts, otherwise the key falls through to Tandem's own key
of the same name (verl's `trainer.save_freq=-1`, `rollout.mode=async`). What the loader does with
a rule is in verl_compat.py; this file is the table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.config.verl_values import (
    ckpt_to_keep,
    logger_list,
    nnodes,
    one_tokenizer,
    rollout_is,
    rollout_tp,
    staleness,
    world_sizes,
)

HONOURED, MAPPED, REFUSED = "honoured", "mapped", "refused"

Get = Callable[[str], Any]  # the effective value of a key: the user's, else Tandem's default, else verl's
Apply = Callable[[Any, Get], dict]  # -> {tandem key: value}; raises ValueError(why) to refuse the value


@dataclass(frozen=True)
class Rule:
    pattern: str
    kind: str  # MAPPED or REFUSED
    why: str  # mapped: to what; refused: why, or what to use instead
    apply: Apply | None = None  # MAPPED: the Tandem keys to set (None: nothing to set)
    accept: tuple = ()  # REFUSED: values Tandem behaves as anyway, besides verl's default
    when: Callable[[Any], bool] | None = None  # the rule applies only to these values


def mapped(pattern: str, why: str, apply: Apply | None = None, when=None) -> Rule:
    return Rule(pattern, MAPPED, why, apply, when=when)


def refused(pattern: str, why: str, *accept) -> Rule:
    return Rule(pattern, REFUSED, why, accept=accept)


def to(key: str) -> Apply:
    """The value as Tandem's `key`."""
    return lambda value, get: {key: value}


def follows(key: str, why: str) -> Apply:
    """Accepted when equal to Tandem's `key` (which Tandem uses instead); refused otherwise."""
    def apply(value, get):
        if value != get(key):
            raise ValueError(f"{why}; it must equal {key}={get(key)!r}: set that key instead")
        return {}
    return apply


MEMORY = "a memory/speed knob with no counterpart: memory is bounded by ppo_micro_batch_size_per_gpu rows " \
         "per micro-batch, packed without padding, and by TP/PP/EP"
ENGINE = "a setting of verl's vLLM/SGLang engines: Tandem generates with its own engine on the policy's " \
         "megatron modules (tandem/generation/)"
PROFILE = "verl's newer profiler settings are not offered: use verl's earlier `profile` keys, which Tandem " \
          "has (actor_rollout_ref.actor.profile.use_profile, .profile_ranks, .step_start, .step_end, .save_path; " \
          "also rollout.profile, critic.profile): torch.profiler traces by role, rank and step"
LORA = "LoRA is not offered (full fine-tuning only)"
MM = "multi-modal data and models are not supported"
RM = "a setting of verl's reward-model workers: Tandem's reward model runs in the reward service " \
     "(reward_model.enable, .model.path, .megatron.*, .micro_batch_size_per_gpu; services.reward.world_size)"
REWARD_PLUGIN = "use custom_reward_function.path (a compute_score file), a rule in services/reward/rules/, or a " \
                "scorer behind protos/tandem/v1/reward.proto with services.reward.endpoint"
REF = "the reference lives in the actor service, with the actor's layout and settings"
DIST_CKPT = "weights load from model.path's Hugging Face safetensors (verl's converter made its megatron " \
            "checkpoint from them; to start from other weights, write them in Hugging Face format)"
MBS = "deprecated in verl; use the matching ..._micro_batch_size_per_gpu key"

RULES: tuple[Rule, ...] = (
    # ---- verl's values on Tandem keys of the same name ----
    mapped("trainer.test_freq", "trainer.test_freq=0 (validate before and after RL only)", lambda v, g: {
        "trainer.test_freq": 0}, when=lambda v: v == -1),
    mapped("actor_rollout_ref.rollout.mode", "Tandem's rollout.mode=colocated (verl's sync and async both "
           "generate in the hybrid engine, on the actor's GPUs; Tandem's values: colocated | standalone)",
           when=lambda v: v in ("sync", "async")),
    mapped("*.megatron.override_transformer_config.attention_backend", "SDPA on CPU, torch's varlen flash "
           "attention on GPUs (tandem/models/attention.py)"),
    # ---- data ----
    mapped("data.tokenizer", "actor_rollout_ref.model.tokenizer_path", to("actor_rollout_ref.model.tokenizer_path")),
    mapped("data.return_raw_chat", "the controller renders the chat template itself; the rollout takes token ids"),
    mapped("data.return_full_prompt", "the reward service always receives prompt_text"),
    refused("data.return_raw_input_ids", "reward models that re-tokenize are not offered"),
    mapped("data.val_batch_size", "validation generates the whole validation set, rollout.max_batch_size rows "
           "at a time"),
    mapped("data.use_shm", MEMORY),
    mapped("data.dataloader_num_workers", "prompts are tokenized once in the controller at start"),
    mapped("data.filter_overlong_prompts_workers", "prompts are tokenized once in the controller at start"),
    refused("data.validation_shuffle", "validation takes the rows in file order"),
    refused("data.tool_config_path", "the rollout reads one: set actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    refused("data.image_*", MM), refused("data.video_key", MM), refused("data.return_multi_modal_inputs", MM),
    mapped("data.trust_remote_code", "no remote code runs: tokenizers load with transformers' own classes"),
    refused("data.custom_cls.*", "a custom dataset class is not loaded: write parquet/jsonl in verl's schema"),
    refused("data.sampler.*", "curriculum samplers are not offered: shuffled epochs (data.shuffle, data.seed)"),
    refused("data.datagen.*", "dynamic data generation is not offered"),
    # ---- model ----
    refused("actor_rollout_ref.model.hf_config_path", "config.json is read from actor_rollout_ref.model.path"),
    mapped("*.model.use_shm", MEMORY),
    mapped("*.model.trust_remote_code", "no remote code runs: only registered architectures load "
           "(tandem/models/families/; another is refused naming them)"),
    refused("actor_rollout_ref.model.custom_chat_template", "put the template in the tokenizer's "
            "tokenizer_config.json (actor_rollout_ref.model.tokenizer_path)"),
    refused("*.model.external_lib", "only registered architectures load (tandem/models/families/)"),
    mapped("*.model.override_config.model_config.max_position_embeddings", "RoPE positions need no table here: "
           "a prompt and its response fit the model as config.json describes it"),
    refused("*.model.override_config.*", "the model's shape comes from its config.json"),
    mapped("*.model.enable_gradient_checkpointing", "activation recomputation in megatron-core is "
           "*.megatron.override_transformer_config.recompute_granularity (full | selective), as in verl"),
    mapped("actor_rollout_ref.model.enable_activation_offload", MEMORY),
    mapped("actor_rollout_ref.model.use_remove_padding", "micro-batches are always packed without padding"),
    refused("*.model.lora_*", LORA), refused("*.model.lora.*", LORA),
    refused("actor_rollout_ref.model.target_modules", LORA), refused("actor_rollout_ref.model.exclude_modules", LORA),
    mapped("actor_rollout_ref.model.use_liger", "log-probs and entropy are fused kernels already "
           "(Triton kernels on GPUs, tandem/models/token_stats_kernel.py)"),
    mapped("actor_rollout_ref.model.use_fused_kernels", "log-probs and entropy are fused kernels already "
           "(Triton kernels on GPUs, tandem/models/token_stats_kernel.py)"),
    mapped("actor_rollout_ref.model.fused_kernel_options.*", "log-probs and entropy are fused kernels already"),
    mapped("actor_rollout_ref.model.tiled_mlp.*", MEMORY),
    refused("*.mtp.*", "multi-token prediction is not offered"),
    # ---- roles: strategy, megatron engine ----
    refused("*.strategy", "Tandem trains with megatron-core only"),
    refused("*._target_", "verl's dataclass targets; Tandem's schema is tandem/config/schema.py"),
    # verl's offload keys are Tandem's (actor and critic: all three; the reference: param_offload)
    refused("actor_rollout_ref.ref.megatron.grad_offload", "the reference has no gradients (its weights: "
           "actor_rollout_ref.ref.megatron.param_offload)"),
    refused("actor_rollout_ref.ref.megatron.optimizer_offload", "the reference has no optimizer (its weights: "
           "actor_rollout_ref.ref.megatron.param_offload)"),
    refused("*.megatron.virtual_pipeline_model_parallel_size", "interleaved pipeline schedules are not offered"),
    mapped("*.megatron.use_dist_checkpointing", DIST_CKPT), mapped("*.megatron.dist_checkpointing_*", DIST_CKPT),
    refused("*.megatron.override_ddp_config*", "DDP is fixed: fp32 gradient reduction, per-token loss units"),
    refused("*.megatron.override_mcore_model_config*", "the model's shape comes from its config.json"),
    mapped("*.megatron.use_mbridge", "Hugging Face weights load through Tandem's family registry "
           "(tandem/models/families/)"),
    mapped("*.megatron.vanilla_mbridge", "Hugging Face weights load through Tandem's family registry"),
    mapped("*.megatron.use_remove_padding", "micro-batches are always packed without padding"),
    mapped("*.megatron.forward_only", "set by the role (the reference and old log-probs run forward only)"),
    # the reference: in the actor service
    mapped("actor_rollout_ref.ref.megatron.tensor_model_parallel_size", REF, follows(
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", REF)),
    mapped("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size", REF, follows(
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size", REF)),
    mapped("actor_rollout_ref.ref.megatron.expert_model_parallel_size", REF, follows(
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size", REF)),
    mapped("actor_rollout_ref.ref.megatron.context_parallel_size", REF, follows(
        "actor_rollout_ref.actor.megatron.context_parallel_size", REF)),
    mapped("actor_rollout_ref.ref.megatron.expert_tensor_parallel_size", REF, follows(
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size", REF)),
    mapped("actor_rollout_ref.ref.megatron.sequence_parallel", REF, follows(
        "actor_rollout_ref.actor.megatron.sequence_parallel", REF)),
    mapped("actor_rollout_ref.ref.megatron.dtype", REF, follows("actor_rollout_ref.actor.megatron.dtype", REF)),
    mapped("actor_rollout_ref.ref.megatron.seed", REF, follows("actor_rollout_ref.actor.megatron.seed", REF)),
    mapped("actor_rollout_ref.ref.megatron.use_distributed_optimizer", "the reference has no optimizer"),
    mapped("actor_rollout_ref.ref.megatron.override_transformer_config*", REF),
    mapped("actor_rollout_ref.ref.use_torch_compile", REF, follows("actor_rollout_ref.actor.use_torch_compile", REF)),
    mapped("*.rollout_n", "actor_rollout_ref.rollout.n", follows("actor_rollout_ref.rollout.n", "verl derives it")),
    mapped("*.nccl_timeout", "torch's default collective timeouts; gRPC calls time out after services.rpc_timeout_s"),
    refused("*.load_weight", "every model starts from model.path (or the built-in shape's initialisation)"),
    # ---- optimizer ----
    refused("*.optim.optimizer", "megatron-core's Adam (decoupled weight decay, as AdamW)", "adamw"),
    refused("*.optim.total_training_steps", "the schedule's length is optim.lr_decay_steps, else "
            "trainer.total_training_steps"),
    refused("*.optim.weight_decay_incr_style", "weight decay is constant (optim.weight_decay)"),
    refused("*.optim.use_checkpoint_opt_param_scheduler", "a resumed run's LR schedule continues from its "
            "checkpoint's step count, with the config's schedule keys"),
    # ---- actor / critic / ref micro-batching ----
    refused("*.ppo_micro_batch_size", MBS), refused("*.log_prob_micro_batch_size", MBS),
    mapped("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "old log-probs run in the update's micro-batches "
           "(actor.use_dynamic_bsz)"),
    mapped("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "old log-probs run in the update's "
           "micro-batches (actor.ppo_max_token_len_per_gpu)"),
    mapped("reward_model.use_dynamic_bsz", "the reward model runs micro-batches of reward_model.micro_batch_size_per_gpu "
           "rows (token budgets: the actor's, reference's and critic's use_dynamic_bsz)"),
    mapped("reward_model.forward_max_token_len_per_gpu", "the reward model runs micro-batches of "
           "reward_model.micro_batch_size_per_gpu rows"),
    mapped("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "old log-probs run in the update's "
           "micro-batches (actor.ppo_micro_batch_size_per_gpu), so the first mini-batch's ppo_kl is exactly 0"),
    mapped("*.data_loader_seed", "mini-batch shuffling (actor.shuffle) is seeded from trainer.seed"),
    refused("critic.shuffle", "critic mini-batches are taken in order"),
    refused("critic.enable", "the critic service runs exactly when algorithm.adv_estimator=gae"),
    mapped("critic.model.path", "the critic has the policy's architecture and starts from the policy "
           "(critic.init_from_policy)", follows("actor_rollout_ref.model.path", "the critic is the policy's model")),
    mapped("critic.model.tokenizer_path", "actor_rollout_ref.model.tokenizer_path", one_tokenizer),
    # ---- actor loss ----
    refused("actor_rollout_ref.actor.tau_*", "parameters of policy-loss modes Tandem does not offer (vanilla, gspo)"),
    refused("actor_rollout_ref.actor.policy_loss.*", "parameters of policy-loss modes Tandem does not offer "
            "(vanilla, gspo)"),
    refused("actor_rollout_ref.actor.freeze_vision_tower", MM),
    refused("actor_rollout_ref.actor.loss_scale_factor", "losses are normalised by loss_agg_mode's units"),
    mapped("actor_rollout_ref.actor.calculate_entropy", "the actor computes entropy when entropy_coeff != 0"),
    mapped("actor_rollout_ref.actor.use_prefix_grouper", "always on: on a dense model each prompt runs once for "
           "the rows that share it in the update and log-prob passes"),
    mapped("actor_rollout_ref.actor.use_fused_kernels", "log-probs and entropy are fused kernels already"),
    refused("*.router_replay.*", "MoE router replay is not offered"),
    refused("*.checkpoint.*", "checkpoints hold model, optimizer and extra state, saved synchronously; write "
            "Hugging Face weights with python -m tandem.services.actor.export"),
    refused("*.profiler.*", PROFILE), refused("global_profiler.*", PROFILE),
    # ---- rollout ----
    mapped("actor_rollout_ref.rollout.name", ENGINE),
    mapped("actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length",
           follows("data.max_prompt_length", "generation reads data.max_prompt_length")),
    mapped("actor_rollout_ref.rollout.response_length", "data.max_response_length",
           follows("data.max_response_length", "generation reads data.max_response_length")),
    mapped("actor_rollout_ref.rollout.dtype", "generation runs in the policy's dtype "
           "(actor_rollout_ref.actor.megatron.dtype)"),
    mapped("actor_rollout_ref.rollout.gpu_memory_utilization", "the KV cache is preallocated for "
           "rollout.max_batch_size rows of max_prompt_length + max_response_length tokens, not a share of the GPU"),
    refused("actor_rollout_ref.rollout.ignore_eos", "generation stops at EOS"),
    mapped("actor_rollout_ref.rollout.enforce_eager", ENGINE), mapped("*.cudagraph_capture_sizes", ENGINE),
    mapped("actor_rollout_ref.rollout.data_parallel_size", "a colocated rollout generates on every actor rank "
           "(the actor's data parallelism); a standalone rollout's is services.rollout.world_size"),
    mapped("actor_rollout_ref.rollout.expert_parallel_size", "generation runs every expert on each rank"),
    refused("actor_rollout_ref.rollout.pipeline_model_parallel_size", "generation does not run on pipeline stages"),
    mapped("actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.max_batch_size (rows decoded "
           "together)", to("actor_rollout_ref.rollout.max_batch_size")),
    mapped("actor_rollout_ref.rollout.max_num_batched_tokens", ENGINE),
    mapped("actor_rollout_ref.rollout.max_model_len", "the KV cache holds max_prompt_length + max_response_length"),
    mapped("actor_rollout_ref.rollout.enable_chunked_prefill", ENGINE),
    mapped("actor_rollout_ref.rollout.enable_prefix_caching", "a prompt's n samples share one prefill"),
    mapped("actor_rollout_ref.rollout.logprobs_mode", "rollout log-probs are log_softmax(logits / temperature) "
           "before top-k/top-p, the quantity the actor recomputes"),
    mapped("actor_rollout_ref.rollout.scheduling_policy", ENGINE), mapped("*.load_format", ENGINE),
    mapped("*.disable_log_stats", ENGINE), mapped("*.skip_tokenizer_init", ENGINE),
    mapped("actor_rollout_ref.rollout.multi_stage_wake_up", ENGINE),
    refused("actor_rollout_ref.rollout.do_sample", "training generation samples (set rollout.temperature)"),
    refused("actor_rollout_ref.rollout.over_sample_rate", "over-sampling is not offered; DAPO's "
            "algorithm.filter_groups generates more prompts instead"),
    mapped("actor_rollout_ref.rollout.engine_kwargs.*", ENGINE),
    refused("actor_rollout_ref.rollout.multi_turn.*", "needs verl's SGLang rollout (its chat re-rendering and checks, "
            "repeated rollouts); Tandem appends each observation (a tool's, an interaction's) as token ids"),
    mapped("actor_rollout_ref.rollout.calculate_log_probs", "the rollout always returns its log-probs "
           "(training/rollout_probs_diff_*, truncated importance sampling)"),
    refused("actor_rollout_ref.rollout.agent.*", "agent loops are not offered"),
    refused("actor_rollout_ref.rollout.checkpoint_engine.backend",
            "a standalone rollout pulls weights over the weight plane: use actor_rollout_ref.rollout.weight_sync.transport"),
    mapped("actor_rollout_ref.rollout.*update_weights_bucket_megabytes",
           "the weight plane's NCCL buckets are actor_rollout_ref.rollout.weight_sync.bucket_mb (256 MiB)"),
    refused("actor_rollout_ref.rollout.checkpoint_engine.*",
            "a standalone rollout pulls weights over the weight plane: see actor_rollout_ref.rollout.weight_sync.*"),
    refused("actor_rollout_ref.rollout.trace.*", "rollout tracing is not offered: trainer.log_val_generations "
            "logs validation samples"),
    refused("actor_rollout_ref.rollout.skip_*", "every step generates"),
    refused("actor_rollout_ref.rollout.enable_rollout_routing_replay", "MoE router replay is not offered"),
    refused("actor_rollout_ref.rollout.prometheus.enable", "each service exports Prometheus metrics on "
            "services.<role>.metrics_port"),
    mapped("actor_rollout_ref.rollout.prometheus.*", "read only with rollout.prometheus.enable=true (refused: "
           "services.<role>.metrics_port)"),
    refused("actor_rollout_ref.rollout.quantization*", "quantized generation is not offered"),
    refused("actor_rollout_ref.rollout.layer_name_map.*", ENGINE),
    mapped("actor_rollout_ref.hybrid_engine", "actor_rollout_ref.rollout.mode=standalone (a rollout service of "
           "its own)", lambda v, g: {} if v else {"actor_rollout_ref.rollout.mode": "standalone"}),
    # ---- reward ----
    refused("reward_model.reward_manager", "rows are scored one by one by rules (verl's naive manager; dapo's "
            "overlong shaping is reward_model.overlong_buffer)", "dapo"),
    refused("reward_manager.name", "rows are scored one by one by rules (verl's naive manager)", "dapo"),
    refused("reward_manager.*", REWARD_PLUGIN),
    refused("reward_model.sandbox_fusion.*", "code sandboxes are not offered: " + REWARD_PLUGIN),
    refused("reward_model.reward_loop_module_path", REWARD_PLUGIN),
    refused("reward_model.reward_loop_class_name", REWARD_PLUGIN),
    mapped("reward_model.launch_reward_fn_async", "the reward service scores while the controller waits on gRPC"),
    # verl's DAPO reward manager's overlong shaping is Tandem's reward_model.overlong_buffer
    mapped("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "reward_model.overlong_buffer.enable",
           to("reward_model.overlong_buffer.enable")),
    mapped("reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward_model.overlong_buffer.len",
           to("reward_model.overlong_buffer.len")),
    mapped("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor",
           "reward_model.overlong_buffer.penalty_factor", to("reward_model.overlong_buffer.penalty_factor")),
    mapped("reward_model.reward_kwargs.overlong_buffer_cfg.log", "reward_model.overlong_buffer.log (the "
           "overlong metrics are always logged)", to("reward_model.overlong_buffer.log")),
    mapped("reward_model.reward_kwargs.max_resp_len", "data.max_response_length",
           follows("data.max_response_length", "the overlong buffer ends at data.max_response_length")),
    refused("reward_model.reward_kwargs.*", "verl's reward manager arguments: Tandem's DAPO shaping is "
            "reward_model.overlong_buffer; a reward function's arguments are custom_reward_function.reward_kwargs"),
    mapped("reward_model.*", RM),
    # ---- algorithm ----
    mapped("algorithm.rollout_correction.rollout_is", "actor_rollout_ref.actor.tis_imp_ratio_cap = "
           "rollout_is_threshold (token-level truncated importance sampling)", rollout_is,
           when=lambda v: v is not None),
    mapped("algorithm.rollout_correction.rollout_is_threshold", "actor_rollout_ref.actor.tis_imp_ratio_cap "
           "(with rollout_is=token)"),
    refused("algorithm.rollout_correction.*", "only token-level truncated importance sampling is offered "
            "(actor_rollout_ref.actor.tis_imp_ratio_cap)"),
    refused("algorithm.use_pf_ppo", "preference-feedback PPO reweighting is not offered"),
    refused("algorithm.pf_ppo.*", "preference-feedback PPO reweighting is not offered"),
    # ---- trainer ----
    mapped("trainer.n_gpus_per_node", "services.{actor, critic (gae), rollout (standalone)}.world_size = "
           "n_gpus_per_node x nnodes (each role's rank r on GPU r, colocated as in verl)", world_sizes),
    mapped("trainer.nnodes", "world sizes count its nodes' GPUs; several nodes: trainer.launcher=ray places "
           "each service's ranks across them (services.<role>.ray)", nnodes),
    mapped("trainer.balance_batch", "each mini-batch is split over data-parallel ranks in order"),
    mapped("trainer.esi_redundant_time", "no elastic-instance deadline"),
    refused("trainer.del_local_ckpt_after_load", "checkpoints are kept"),
    refused("trainer.default_hdfs_dir", "checkpoints go to trainer.default_local_dir only"),
    mapped("trainer.max_*_ckpt_to_keep", "trainer.max_ckpt_to_keep: one checkpoint holds actor and critic, so "
           "the larger of the two is kept (nothing a user asked to keep is removed)", ckpt_to_keep),
    mapped("trainer.ray_wait_register_center_timeout", "no Ray: services.startup_timeout_s"),
    mapped("trainer.device", "GPUs when present, else CPU (tandem/parallel/device.py)"),
    refused("trainer.rollout_data_dir", "rollouts are not dumped; trainer.log_val_generations logs validation "
            "samples"),
    mapped("trainer.use_legacy_worker_impl", "Tandem's own services"),
    refused("transfer_queue.enable", "batches go between services over gRPC"),
    mapped("ray_kwargs.*", "no Ray: services are processes started by the launcher (controller/launchers/)"),
    # ---- verl's values of Tandem keys that Tandem writes otherwise ----
    mapped("trainer.logger", "trainer.logger as a list", logger_list, when=lambda v: isinstance(v, str)),
    mapped("actor_rollout_ref.rollout.tensor_model_parallel_size", "a colocated rollout generates at the actor's "
           "TP (or 1): verl's engine TP becomes the actor's, and 1 behind a pipeline-parallel actor", rollout_tp,
           when=lambda v: isinstance(v, int) and v > 1),
    mapped("async_training.staleness_threshold", "a whole number of weight versions", staleness,
           when=lambda v: isinstance(v, float) and not v.is_integer()),
)
