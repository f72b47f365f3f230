"""ActorWorker: this rank's shard of the policy (trained) and its frozen reference.

Plain Python, no gRPC. Every rank of the actor service holds one; the front door
(services/actor/front.py) lays batches out over the DP ranks and calls the same method on
every rank through tandem.serving.rank_group. Methods take this rank's shards of the
mini-batches (None where it has no rows) and return per-shard results.
"""
from __future__ import annotations

import functools

import torch

from tandem import checkpoint
from tandem.algos import metrics as M
from tandem.config import OptimConfig, TandemConfig
from tandem.config.transformer_overrides import passed_overrides
from tandem.data.batch import DataProto
from tandem.models.build import build_gpt_model
from tandem.models.compile import compile_layers
from tandem.models.shape_from_config import model_shape
from tandem.parallel import device
from tandem.services.actor.memory import actor_memory
from tandem.serving.startup import StartupClock
from tandem.train import losses
from tandem.train.memory_metrics import memory_metrics
from tandem.train.microbatch import Split, actor_split
from tandem.train.moe_aux_loss import load_balancing
from tandem.train.optim import Optimizer, wrap_ddp
from tandem.train.schedule import reads_responses_only, shares_prompts
from tandem.train.step import forward_rows, rows_on_host, train_steps


class ActorWorker:
    def __init__(self, cfg: TandemConfig, tokenizer_len: int, clock: StartupClock | None = None):
        """clock: where the start-up phases' seconds go (the service's start-up report)."""
        from megatron.core import parallel_state as ps

        clock = clock or StartupClock()
        self.cfg = cfg
        self.actor_cfg = cfg.actor_rollout_ref.actor
        mcfg = self.actor_cfg.megatron
        self.shape = model_shape(cfg.actor_rollout_ref.model, tokenizer_len)
        self.vocab_size = self.shape.vocab_size
        self.architecture = _architecture(cfg.actor_rollout_ref.model.path)
        tp, pp, ep = mcfg.tensor_model_parallel_size, mcfg.pipeline_model_parallel_size, mcfg.expert_model_parallel_size
        dtype = device.parse_dtype(mcfg.dtype)
        sp, over = mcfg.sequence_parallel, passed_overrides(mcfg)
        with clock.phase("build policy"):
            self.policy = build_gpt_model(self.shape, tp=tp, pp=pp, ep=ep, params_dtype=dtype, sequence_parallel=sp,
                                          overrides=over, weights_follow=bool(cfg.actor_rollout_ref.model.path))
        if cfg.actor_rollout_ref.model.path:  # start from the Hugging Face checkpoint
            from tandem.convert.hf_load import load_hf_weights

            with clock.phase("load checkpoint"):
                load_hf_weights(self.policy, cfg.actor_rollout_ref.model.path, self.shape,
                                ps.get_tensor_model_parallel_rank(), tp)
        with clock.phase("DDP wrap (gradient buffers)"):
            self.ddp = wrap_ddp(self.policy, mcfg.use_distributed_optimizer)
        # megatron modules hold process groups: no deepcopy
        with clock.phase("build reference"):
            self.ref = build_gpt_model(self.shape, tp=tp, pp=pp, ep=ep, params_dtype=dtype, sequence_parallel=sp,
                                       overrides=over, weights_follow=True)  # the policy's copy (_copy_to_reference)
        if self.actor_cfg.use_torch_compile and device.has_cuda():
            with clock.phase("compile wrap"):
                compile_layers(self.policy)
                compile_layers(self.ref)
        self.load_balancing = load_balancing(self.policy, self.shape, mcfg, cfg.actor_rollout_ref.model)
        # rows of one prompt (a GRPO group) run it once in the update and log-prob passes; MoE: the router's
        # load-balancing loss counts each row's own tokens, so rows keep their prompts
        self.share_prompts = self.shape.moe is None
        with clock.phase("copy policy to reference"):
            self._copy_to_reference()
        per_step = max(1, cfg.data.train_batch_size // self.actor_cfg.ppo_mini_batch_size) * self.actor_cfg.ppo_epochs
        with clock.phase("optimizer"):
            self.optimizer = Optimizer(self.ddp, self.actor_cfg.optim, cfg.trainer.total_training_steps, per_step)
        self.sft_optimizer: Optimizer | None = None
        self._last_trained: Optimizer | None = None  # whose fp32 main weights match the model
        self.exported: dict[str, torch.Tensor] | None = None  # stage_export's copy (rank 0)
        # what each call needs on the device (verl's offload keys); host buffers come at the first offload
        self.memory = actor_memory(self)

    # ---- log-probs -------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, shards: list[DataProto | None], which: str, temperature: float,
                  entropy: bool, micro: Split) -> list[DataProto | None]:
        """Per shard: 'log_probs' [B, R] fp32 (+ 'entropys') of `which` ('policy' or 'ref')."""
        with self.memory.phase("log_probs" if which == "policy" else "ref_log_probs"):
            return self._log_probs(self.ddp if which == "policy" else self.ref, shards, temperature,
                                   entropy, micro)

    @torch.no_grad()
    def log_probs_pair(self, policy: list[DataProto | None], ref: list[DataProto | None], temperature: float,
                       entropy: bool, micro_policy: Split, micro_ref: Split) -> tuple[list, list]:
        """log_probs of the policy over `policy`, then of the reference over `ref`, read back once after
        both: the reference's host work runs while the GPU finishes the policy's pass, and an offloaded
        reference's copies to the device run beside that pass."""
        with self.memory.phase("log_probs"):
            self.memory.prefetch("ref")
            first = self._log_probs(self.ddp, policy, temperature, entropy, micro_policy, read_back=False)
            self.memory.enter("ref_log_probs")
            second = self._log_probs(self.ref, ref, temperature, False, micro_ref, read_back=False)
        return rows_on_host(first), rows_on_host(second)

    def _log_probs(self, model, shards, temperature, entropy, micro, read_back: bool = True):
        model.eval()

        @reads_responses_only
        def loss_fn(output, mb):
            lp, ent = losses.response_log_probs(output, mb, temperature, with_entropy=entropy)
            out = {"log_probs": lp.float()}  # left on the device: read back once per call
            if entropy:
                out["entropys"] = ent.float()
            return output.new_zeros(()), 0, out

        shares_prompts(loss_fn, self.share_prompts)
        return forward_rows(model, shards, micro, loss_fn, read_back)

    # ---- training --------------------------------------------------------------------
    def update(self, shards: list[DataProto], temperature: float) -> dict:
        """One optimizer step per mini-batch shard; rows marked ON_POLICY_ROW take the loss's own
        forward's old log-probs, and every row's come back (tandem/train/losses.py)."""
        loss_fn = functools.partial(losses.ppo_actor_loss, cfg=self.actor_cfg, temperature=temperature)
        shares_prompts(loss_fn, self.share_prompts)
        with self.memory.phase("train"):
            out = self._train(self.optimizer, shards, loss_fn, M.ACTOR_GRAD_NORM, M.ACTOR_LR)
            out["steps"].update(memory_metrics("actor"))  # the step's peaks in this process (colocated: all phases)
        return out

    def train_sft(self, shards: list[DataProto]) -> dict:
        """Cross-entropy on batch['loss_mask'] tokens (warm start), its own optimizer."""
        sft = self.cfg.trainer.sft
        with self.memory.phase("train"):
            if self.sft_optimizer is None:  # offloaded like the RL optimizer (the same override)
                self.sft_optimizer = Optimizer(self.ddp, OptimConfig(
                    lr=sft.lr, weight_decay=sft.weight_decay,
                    override_optimizer_config=self.actor_cfg.optim.override_optimizer_config))
            return self._train(self.sft_optimizer, shards, losses.sft_loss, "sft/grad_norm", "sft/lr")

    def _train(self, optimizer: Optimizer, shards, loss_fn, grad_norm_key: str, lr_key: str) -> dict:
        if self._last_trained is not None and self._last_trained is not optimizer:
            optimizer.reload_model_params()  # the other optimizer moved the weights (bf16 main copies)
        self._last_trained = optimizer
        micro = actor_split(self.actor_cfg)
        moe_key = M.ACTOR_MOE_LOAD_BALANCING_LOSS if optimizer is self.optimizer else M.SFT_MOE_LOAD_BALANCING_LOSS
        with self.load_balancing.update(shards, micro, moe_key) as moe_metrics:
            out = train_steps(self.ddp, optimizer, shards, micro, loss_fn, grad_norm_key, lr_key)
        out["weighted"].update(moe_metrics)
        return out

    def set_reference(self) -> None:
        """reference := current policy (after the SFT warm start)."""
        with self.memory.phase("checkpoint"):
            self._copy_to_reference()

    def _copy_to_reference(self) -> None:
        self.ref.load_state_dict(self.policy.state_dict())
        self.ref.requires_grad_(False)
        self.ref.eval()

    # ---- weights and checkpoints ------------------------------------------------------
    def export_weights(self) -> dict[str, torch.Tensor]:
        """The policy in the TP=1, PP=1 layout (what a rollout at TP=1 loads) on the CPU, on TP
        rank 0 of DP rank 0 (None elsewhere: the front door uses that one copy)."""
        with self.memory.phase("weights"):
            weights = self._tp1()
            return None if weights is None else {k: v.detach().cpu() for k, v in weights.items()}

    def stage_export(self) -> None:
        """The same weights kept on this rank's device, on global rank 0 only (the weight plane
        reads them there, tandem/weights/source.py; at TP = PP = EP = 1 they are the parameters
        themselves, or copies of them with param_offload: the weight plane reads them after this
        call, when the parameters' storage may be in host memory): `self.exported`."""
        import torch.distributed as dist

        self.exported = None  # the previous version's copy goes before the new one is built
        with self.memory.phase("weights"):
            weights = self._tp1()
            if weights is not None and self.memory.groups["policy"].offload and _views_of(weights, self.policy):
                weights = {k: v.clone() for k, v in weights.items()}
        self.exported = weights if dist.get_rank() == 0 else None

    def release(self) -> None:
        """The run is released: the offload state (stashed bytes, pinned host buffers) goes with it."""
        self.exported = None
        self.memory.drop()

    def _tp1(self) -> dict[str, torch.Tensor] | None:
        """The TP=1 layout in the weight table's order on TP rank 0 of DP rank 0 (on the device);
        at TP > 1 or PP > 1 the ranks of DP rank 0 take part in the gather, at EP > 1 every
        rank (experts live on other DP ranks)."""
        from megatron.core import parallel_state as ps

        from tandem.models.registry import weight_mappings

        mcfg = self.actor_cfg.megatron
        ep = mcfg.expert_model_parallel_size
        dp_cp_rank = ps.get_data_parallel_rank(with_context_parallel=True)
        if dp_cp_rank != 0 and ep == 1:  # every DP (and CP) replica holds the same weights
            return None  # (at EP > 1 the other DP ranks hold the other experts: every rank gathers)
        if mcfg.tensor_model_parallel_size == 1 and ep == 1 and mcfg.pipeline_model_parallel_size == 1:
            params = dict(self.policy.named_parameters())
            weights = {m.megatron: params[m.megatron].detach() for m in weight_mappings(self.shape)}
        else:
            from tandem.convert.reshard import tp1_weights

            weights = tp1_weights(self.policy, self.shape)
        if ps.get_tensor_model_parallel_rank() != 0 or dp_cp_rank != 0:
            return None
        return weights

    def export_hf(self, out_dir: str, tokenizer_dir: str | None) -> str:
        """The policy as a Hugging Face checkpoint (TP shards gathered; TP rank 0 of DP rank 0 writes)."""
        from tandem.convert.hf_export import export_hf

        with self.memory.phase("weights"):
            export_hf(self.policy, self.shape, out_dir, self.architecture, tokenizer_dir=tokenizer_dir)
        return out_dir

    def save(self, path: str, meta: dict) -> str:
        with self.memory.phase("checkpoint"):
            return checkpoint.save_models(path, {"policy": self.policy, "ref": self.ref}, self.optimizer, meta)

    def load(self, path: str) -> dict:
        with self.memory.phase("checkpoint"):
            meta = checkpoint.load_models(path, {"policy": self.policy, "ref": self.ref}, self.optimizer)
        self._last_trained = self.optimizer  # loaded together with the weights
        return meta


def _views_of(weights: dict[str, torch.Tensor], model) -> bool:
    """Whether any of `weights` shares storage with `model`'s parameters."""
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return any(t.untyped_storage().data_ptr() in ptrs for t in weights.values())


def _architecture(hf_dir: str | None) -> str:
    """The Hugging Face class the policy exports as: the source checkpoint's, else Llama."""
    if not hf_dir:
        return "LlamaForCausalLM"
    from tandem.models.registry import architecture_of, read_hf_config

    return architecture_of(read_hf_config(hf_dir))
