"""megatron-core DDP and optimizer for one trained model, with verl's LR schedule (megatron-core's
OptimizerParamScheduler: warmup, then constant, linear, cosine, inverse-square-root or WSD decay).

The model is wrapped in megatron's DistributedDataParallel (gradients in fp32 buffers,
summed over data-parallel ranks because the model config sets calculate_per_token_loss);
the schedule's finalize_model_grads divides them by the mini-batch's loss units. The
optimizer is megatron's (Adam, global grad-norm clipping over TP/PP, optional distributed
optimizer, optional CPU offload of a share of Adam (optim.override_optimizer_config), sharded
state dicts that reshard on load).
"""
from __future__ import annotations

import torch

from tandem.config import OptimConfig
from tandem.train import cpu_adam, foreach_fallbacks


def wrap_ddp(model, use_distributed_optimizer: bool = False):
    """megatron DDP around a GPTModel whose config already sets calculate_per_token_loss."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    model.config.finalize_model_grads_func = finalize_model_grads
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=use_distributed_optimizer)
    return DistributedDataParallel(model.config, ddp_config, model)


def _load_steps_into_torch_adam() -> None:
    """megatron-core's distributed optimizer, loading its `fully_reshardable` state into torch's
    Adam (no Transformer Engine / Apex), copies every tensor of a parameter's state from the
    checkpoint, the per-parameter `step` counter included, which the checkpoint does not carry
    (megatron has already set it from the saved param groups): KeyError 'step'. Give it the
    counter it already set. Applied once."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D

    setter = D._set_main_param_and_optimizer_states
    if getattr(setter, "_tandem", False):
        return

    def set_states(self, model_param, tensors):
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            step = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]].get("step")
            tensors = tensors if step is None else {**tensors, "step": step}
        return setter(self, model_param, tensors)

    set_states._tandem = True
    D._set_main_param_and_optimizer_states = set_states


def lr_schedule(cfg: OptimConfig, total_steps: int | None, per_step: int = 1):
    """megatron-core's OptimizerParamScheduler for optim's schedule keys, which count training steps
    (verl's meaning), over optimizer steps (`per_step` of them a training step: mini-batches x
    ppo_epochs), so the LR moves at every mini-batch along verl's curve. It is only asked for the LR
    (get_lr); weight decay stays megatron's per-group setting."""
    from types import SimpleNamespace

    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    decay = cfg.lr_decay_steps or total_steps or 0
    warmup = cfg.lr_warmup_steps if cfg.lr_warmup_steps >= 0 else int(cfg.lr_warmup_steps_ratio * decay)
    warmup, decay = warmup * per_step, decay * per_step
    if cfg.lr_decay_style == "constant":  # no decay: megatron still asks for decay steps after warmup
        decay = max(decay, warmup + 1)
    wsd = cfg.lr_wsd_decay_steps * per_step if cfg.lr_wsd_decay_steps else None
    return OptimizerParamScheduler(
        SimpleNamespace(param_groups=[]), init_lr=cfg.lr_warmup_init, max_lr=cfg.lr, min_lr=cfg.min_lr,
        lr_warmup_steps=warmup, lr_decay_steps=decay, lr_decay_style=cfg.lr_decay_style,
        start_wd=cfg.weight_decay, end_wd=cfg.weight_decay, wd_incr_steps=decay, wd_incr_style="constant",
        wsd_decay_steps=wsd, lr_wsd_decay_style=cfg.lr_wsd_decay_style)


class Optimizer:
    """megatron Adam over a DDP model; `step()` clips, steps and returns the pre-clip grad norm."""

    def __init__(self, ddp_model, cfg: OptimConfig, total_steps: int | None = None, per_step: int = 1):
        """total_steps: the run's training steps (trainer.total_training_steps), the length of a
        decaying LR schedule unless optim.lr_decay_steps sets it; per_step: optimizer steps a
        training step takes (mini-batches x ppo_epochs)."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from tandem.parallel import device

        foreach_fallbacks.install()  # before megatron's optimizer is built and used
        if ddp_model.ddp_config.use_distributed_optimizer:
            _load_steps_into_torch_adam()
        self.model = ddp_model
        self.cfg = cfg
        config = ddp_model.module.config
        # checked by tandem/config/checks/memory.py; null is megatron-core's default, as in verl
        override = {k: v for k, v in cfg.override_optimizer_config.items() if v is not None}
        if override.get("optimizer_cpu_offload") and not device.has_cuda():
            raise ValueError("optim.override_optimizer_config.optimizer_cpu_offload: megatron-core's CPU "
                             "optimizer offload needs CUDA (it overlaps copies on CUDA streams); set it to false on CPU")
        self.opt = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
            adam_beta2=cfg.betas[1], adam_eps=1e-8, clip_grad=cfg.clip_grad,
            bf16=config.params_dtype == torch.bfloat16, params_dtype=config.params_dtype,
            use_distributed_optimizer=ddp_model.ddp_config.use_distributed_optimizer, **override), [ddp_model])
        self.steps = 0
        self.before_step = None  # set while the state is coming back from host memory (phases.py)
        self.schedule = lr_schedule(cfg, total_steps, per_step)
        self._apply_lr()
        self._fuse_torch_adam()
        for hybrid in cpu_adam.hybrid_optimizers(self._megatron_torch_optimizers()):  # megatron's CPU offload
            cpu_adam.pin_after_every_load(hybrid)

    @property
    def checkpoint_format(self) -> str:
        """'distributed' or 'plain': megatron-core's two optimizers save different state dicts."""
        return "distributed" if self.model.ddp_config.use_distributed_optimizer else "plain"

    def _megatron_torch_optimizers(self) -> list:
        """The torch optimizer each megatron optimizer (chained or not) wraps: torch's or TE's / Apex's
        Adam, or megatron's HybridDeviceOptimizer (CPU optimizer offload)."""
        inners = [getattr(inner, "optimizer", None) for inner in getattr(self.opt, "chained_optimizers", [self.opt])]
        return [o for o in inners if o is not None]

    def _torch_optimizers(self) -> list:
        """The torch optimizers doing the work: one per megatron optimizer, or the GPU and CPU
        parts of megatron's HybridDeviceOptimizer (CPU optimizer offload)."""
        return [sub for o in self._megatron_torch_optimizers() for sub in getattr(o, "sub_optimizers", [o])]

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the optimizer keeps: its parameters (fp32 main weights; for an fp32 model
        the model's own, which callers exclude) and their state (Adam moments, step counters)."""
        out = []
        for torch_opt in self._torch_optimizers():
            for group in torch_opt.param_groups:
                out.extend(group["params"])
            for state in torch_opt.state.values():
                out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return out

    def _fuse_torch_adam(self) -> None:
        """Without Transformer Engine or Apex megatron falls back to torch's AdamW with its
        default multi-tensor loop; on GPUs torch's fused kernel reads and writes each
        parameter's state once (about 2x faster on a 0.5B model). Set before the first step,
        which creates the step counters on the device as the fused kernel needs."""
        for torch_opt in self._megatron_torch_optimizers():
            if not isinstance(torch_opt, torch.optim.AdamW):
                continue  # TE's or Apex's fused Adam
            for group in torch_opt.param_groups:
                if all(p.is_cuda and p.is_floating_point() for p in group["params"]):
                    group["fused"], group["foreach"] = True, False
                    for p in group["params"]:  # loaded state: its step counter goes to the device
                        state = torch_opt.state.get(p, {})
                        if "step" in state:
                            state["step"] = state["step"].to(p.device, torch.float32)

    @property
    def lr(self) -> float:
        """The LR of the next step: the schedule at step steps + 1 (the first step takes 1/warmup of
        the way from lr_warmup_init to lr; verl's first takes 0)."""
        self.schedule.num_steps = self.steps + 1
        return self.schedule.get_lr({})

    def _apply_lr(self) -> None:
        for group in self.opt.param_groups:
            group["lr"] = self.lr

    def zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.opt.zero_grad()

    def _state_ready(self) -> None:
        """Before anything reads or writes the state: its copies back from host memory must have run."""
        if self.before_step is not None:
            self.before_step()
            self.before_step = None

    def step(self) -> float:
        self._state_ready()
        with torch.profiler.record_function("tandem.optimizer_step"):  # a range of its own in traces
            _, grad_norm, _ = self.opt.step()
        self.steps += 1
        self._apply_lr()
        # no zero_grad here: train_steps zeroes before each mini-batch (a second pass over
        # the fp32 grad buffer per step was ~1-2 ms on a 0.5B-1.5B model)
        return float(grad_norm) if grad_norm is not None else 0.0

    def sharded_state_dict(self, model_sharded_state_dict: dict, is_loading: bool = False) -> dict:
        """The distributed optimizer in megatron's `fully_reshardable` format (its default format
        is refused by megatron's own checkpointing: "flattened_range is not supported")."""
        self._state_ready()
        metadata = None
        if self.model.ddp_config.use_distributed_optimizer:
            metadata = {"distrib_optim_sharding_type": "fully_reshardable"}
            if is_loading:
                self._init_state()
        return self.opt.sharded_state_dict(model_sharded_state_dict, is_loading=is_loading, metadata=metadata)

    def _init_state(self) -> None:
        """Zero Adam state (step 0) where there is none yet: megatron's distributed optimizer reads
        the step counter of its state before it loads one (and asserts there is one)."""
        for torch_opt in self._torch_optimizers():
            for group in torch_opt.param_groups:
                for p in group["params"]:
                    state = torch_opt.state[p]
                    if not state:
                        state.update(step=torch.zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))

    def reload_model_params(self) -> None:
        """The model's parameters changed outside this optimizer (a checkpoint, another
        optimizer): refresh its fp32 main copies (bf16 models), or they would overwrite the
        change at the next step."""
        self._state_ready()
        self.opt.reload_model_params()

    def reset(self) -> None:
        """Back to no state (a checkpoint taken before the first step), main copies refreshed."""
        self._state_ready()
        for torch_opt in self._megatron_torch_optimizers():
            torch_opt.state.clear()
        for torch_opt in self._torch_optimizers():  # the CPU offload's parts hold their own
            torch_opt.state.clear()
        self.steps = 0
        self._apply_lr()
        self.reload_model_params()

    def load_state_dict(self, state: dict, steps: int) -> None:
        self._state_ready()
        self.opt.load_state_dict(state)
        for torch_opt in self._torch_optimizers():  # megatron's distributed optimizer loads one step
            for param_state in torch_opt.state.values():  # tensor into every parameter's state, which
                if torch.is_tensor(param_state.get("step")):  # torch's Adam then advances once per parameter
                    param_state["step"] = param_state["step"].clone()
        self._fuse_torch_adam()  # loading replaced the param groups' flags with the saved ones
        self.steps = steps
        self._apply_lr()
