"""Micro-batches through megatron-core's forward/backward schedule (any PP size).

Each micro-batch runs packed, without padding (tandem/models/packing.py).
`loss_fn(output, mb) -> (loss, units, metrics)` gets the model output of the last
pipeline stage (logits, or values for a scalar head) as a PackedOutput, read in the
padded layout through tandem.models.packing.take_positions: `loss` is the micro-batch's mean
over its `units` (tokens or rows, per the loss_agg_mode). The schedule backpropagates
loss x units; finalize_model_grads sums units over micro-batches and DP ranks and
divides the gradients by it, so the mini-batch's gradient is exact at any split.
At context parallelism > 1 each rank runs its share of every packed micro-batch and the
output comes back whole (tandem/models/context_parallel.py).
Metrics come back weighted by units (sums), for the caller to normalise; scalar metrics
may be device tensors (read back once, by the caller), so the schedule never waits for the GPU.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from tandem.data.batch import DataProto
from tandem.models.context_parallel import gather_output
from tandem.models.forward import sequence_split
from tandem.models.packing import (
    PackedOutput,
    Packing,
    packed_rope,
    selected_outputs,
    selects_outputs,
)
from tandem.models.shared_prompts import SharedPromptPacking


def is_scalar(v) -> bool:
    """A metric value (a float, or a 0-dim tensor left on the device), not per-row outputs."""
    return isinstance(v, float) or (isinstance(v, torch.Tensor) and v.dim() == 0)


def reads_responses_only(loss_fn: Callable) -> Callable:
    """Mark a loss_fn that reads only the outputs predicting response tokens: the LM head then
    runs on those positions alone (tandem/models/packing.py, `selected_outputs`)."""
    loss_fn.reads_responses_only = True
    return loss_fn


def shares_prompts(loss_fn: Callable, on: bool = True) -> Callable:
    """Mark a loss_fn (that reads responses only) to run with each prompt packed once for the
    rows that share it (tandem/models/shared_prompts.py); `on`: the config's choice."""
    loss_fn.shares_prompts = on
    return loss_fn


def _packing(mb: DataProto, multiple: int, share: bool, responses_only: bool, select: bool,
             cp: tuple[int, int] = (1, 0)) -> Packing:
    """cp: (context-parallel size, this rank's CP rank); `multiple` already holds 2 x size."""
    if share:
        packing = SharedPromptPacking(mb["attention_mask"], mb["input_ids"], mb["responses"].shape[1], multiple)
    else:
        packing = Packing(mb["attention_mask"], multiple=multiple)
    if responses_only and select:
        packing.keep_responses(mb["responses"].shape[1])
    if cp[0] > 1:
        packing.split_context(*cp)
    return packing


def run_schedule(model, micro_batches: list[DataProto], loss_fn: Callable,
                 forward_only: bool) -> list[dict]:
    """One schedule pass; returns per-micro-batch outputs of loss_fn on the last PP stage
    ({"units": n, metric: value x n, ...}); empty on other stages."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from tandem.parallel import device

    dev = device.device()

    responses_only = getattr(getattr(loss_fn, "func", loss_fn), "reads_responses_only", False)
    cp = parallel_state.get_context_parallel_world_size()
    cp_rank = parallel_state.get_context_parallel_rank()
    last_stage = parallel_state.is_pipeline_last_stage()
    prepare = functools.partial(_packing, multiple=sequence_split(model) * (2 * cp if cp > 1 else 1),
                                cp=(cp, cp_rank),
                                share=responses_only and getattr(loss_fn, "shares_prompts", False),
                                responses_only=responses_only, select=selects_outputs(model))
    packings = [prepare(mb) for mb in micro_batches]
    it = iter(zip(micro_batches, packings))
    seq_length = max(p.total for p in packings)

    def forward_step(data_iterator, model):
        mb, packing = next(data_iterator)
        with packed_rope(model, packing, dev), selected_outputs(model, packing, dev):
            output = model(device.to_device(packing.pack(mb["input_ids"]), dev), None, None,
                           packed_seq_params=packing.params(dev))
        if packing.cp is not None and last_stage:  # back in the CP=1 order on every CP rank
            output = gather_output(output, packing.cp, packing.kept)

        def loss_func(output_tensor):
            loss, units, metrics = loss_fn(PackedOutput(output_tensor, packing), mb)
            weighted = {k: (v * units if is_scalar(v) else v) for k, v in metrics.items()}
            weighted["units"] = units
            # torch.full, not torch.tensor: a host-to-device copy would wait for the GPU. Every CP rank
            # computes the same loss (each back-propagates its own tokens); the units count once
            counted = units if cp_rank == 0 else 0
            return loss * units, torch.full((), counted, dtype=torch.int, device=dev), weighted

        return output, loss_func

    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=it, model=model,
        num_microbatches=len(micro_batches), seq_length=seq_length, micro_batch_size=1,
        forward_only=forward_only)
