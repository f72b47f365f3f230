"""Optimizer, LR warmup, gradient clipping and the optimizer step for one model."""
from __future__ import annotations

import torch

from tandem.config import OptimConfig


class Optimizer:
    """AdamW with linear warmup; `step()` clips, steps and returns the pre-clip grad norm."""

    def __init__(self, params, cfg: OptimConfig):
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.betas),
                                     weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / max(1, cfg.lr_warmup_steps)))

    @property
    def lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_grad)
        if torch.isfinite(grad_norm):
            self.opt.step()
        self.sched.step()
        self.zero_grad()
        return float(grad_norm)

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "sched": self.sched.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
