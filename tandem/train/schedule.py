"""Micro-batches through megatron-core's forward/backward schedule (any PP size).

`loss_fn(output, mb) -> (loss, units, metrics)` gets the model output of the last
pipeline stage (logits, or values for a scalar head): `loss` is the micro-batch's mean
over its `units` (tokens or rows, per the loss_agg_mode). The schedule backpropagates
loss x units; finalize_model_grads sums units over micro-batches and DP ranks and
divides the gradients by it, so the mini-batch's gradient is exact at any split.
Metrics come back weighted by units (sums), for the caller to normalise.
"""
from __future__ import annotations

from typing import Callable

import torch

from tandem.data.batch import DataProto
from tandem.models.forward import forward_logits


def run_schedule(model, micro_batches: list[DataProto], loss_fn: Callable,
                 forward_only: bool) -> list[dict]:
    """One schedule pass; returns per-micro-batch outputs of loss_fn on the last PP stage
    ({"units": n, metric: value x n, ...}); empty on other stages."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from tandem.dist import device

    dev = device.device()
    it = iter(micro_batches)

    def forward_step(data_iterator, model):
        mb = next(data_iterator)
        output = forward_logits(model, mb["input_ids"].to(dev), mb["attention_mask"].to(dev))

        def loss_func(output_tensor):
            loss, units, metrics = loss_fn(output_tensor, mb)
            weighted = {k: (v * units if isinstance(v, float) else v) for k, v in metrics.items()}
            weighted["units"] = units
            return loss * units, torch.tensor(units, dtype=torch.int, device=dev), weighted

        return output, loss_func

    longest = max(mb["input_ids"].shape[1] for mb in micro_batches)
    widest = max(len(mb) for mb in micro_batches)
    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=it, model=model,
        num_microbatches=len(micro_batches), seq_length=longest, micro_batch_size=widest,
        forward_only=forward_only)
