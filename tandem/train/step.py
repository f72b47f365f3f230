"""Optimizer steps over this rank's shards of mini-batches (one step each), and forward-only
passes over shards (log-probs, values).

Every rank of a DP group gets its shard of the same global mini-batches, in order
(tandem/serving/dispatch.py); gradients are summed over micro-batches and DP ranks and
divided by the mini-batch's loss units (tandem/train/schedule.py), so the update is the
same at any TP / DP / micro-batch split.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch

from tandem.data.batch import DataProto
from tandem.train.microbatch import Split, micro_batches
from tandem.train.optim import Optimizer
from tandem.train.schedule import is_scalar, run_schedule


def train_steps(model, optimizer: Optimizer, minis: list[DataProto], micro: Split,
                loss_fn: Callable, grad_norm_key: str, lr_key: str) -> dict:
    """-> {"weighted": {metric: sum over minis of (sum of value x units) / mini units},
    "steps": {grad_norm_key: mean, lr_key: mean}, "rows": one DataProto per mini of the
    loss's per-row outputs (e.g. on-policy old log-probs; None when it has none)}. The front
    door sums "weighted" over DP ranks and divides by the number of mini-batches."""
    weighted: dict[str, float] = defaultdict(float)
    grad_norms, lrs, rows = [], [], []
    model.train()
    for mini in minis:
        total_units = float(mini.meta["loss_units"])  # of the global mini-batch, all DP ranks
        optimizer.zero_grad()
        outs = run_schedule(model, micro_batches(mini, micro), loss_fn, forward_only=False)
        per_row: dict[str, list] = defaultdict(list)
        for out in outs:
            for k, v in out.items():
                if k == "units":
                    continue
                if is_scalar(v):
                    weighted[k] += v / max(total_units, 1.0)
                else:  # [rows, ...] of the micro-batch, left on the device until here
                    per_row[k].append(v)
        rows.append({k: torch.cat(v) for k, v in per_row.items()} if per_row else None)  # still on the device
        lrs.append(optimizer.lr)
        grad_norms.append(optimizer.step())
    return {"weighted": host_floats(weighted),
            "steps": {grad_norm_key: sum(grad_norms) / len(grad_norms), lr_key: sum(lrs) / len(lrs)},
            "rows": [_on_host(r) for r in rows]}  # read back after the last step: one wait per call


def forward_rows(model, shards: list[DataProto | None], micro: Split, loss_fn: Callable,
                 read_back: bool = True) -> list:
    """Per shard: the loss_fn's per-row outputs (its third value, 'units' aside) of a forward-only pass,
    read back to the host once, after every shard's forward (one wait per call, not per shard).
    read_back=False: left on the device (rows_on_host later), so that another pass queued behind
    this one leaves the GPU no gap."""
    out = []
    for shard in shards:
        parts = [] if shard is None else run_schedule(model, micro_batches(shard, micro), loss_fn,
                                                      forward_only=True)
        out.append({k: torch.cat([p[k] for p in parts]) for k in parts[0] if k != "units"} if parts else None)
    return rows_on_host(out) if read_back else out


def rows_on_host(shards: list[dict | None]) -> list[DataProto | None]:
    """forward_rows(read_back=False)'s per-shard outputs -> DataProtos on the host."""
    return [_on_host(r) for r in shards]


def _on_host(tensors: dict | None) -> DataProto | None:
    """Per-row outputs (device tensors by name) -> a DataProto on the host."""
    return None if tensors is None else DataProto(tensors={k: v.cpu() for k, v in tensors.items()})


def host_floats(metrics: dict) -> dict:
    """Device scalar metrics -> floats, in one device-to-host copy."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    values = torch.stack([metrics[k].float().reshape(()) for k in keys]).tolist() if keys else []
    return {**metrics, **dict(zip(keys, values))}
