"""Running a GPTModel on padded token batches: masks and the response slice.

Layout (verl's): each row is [left-padded prompt | right-padded response], with
`attention_mask` [B, T] = 1 on real tokens. RoPE scores depend only on relative
positions, so a row's left padding does not change its outputs once pad keys are masked.
"""
from __future__ import annotations

import torch


def attention_mask_4d(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] (1 = real token) -> megatron bool mask [B, 1, T, T], True = do not attend.

    Causal over real keys; every query may attend to itself, so padding queries have a
    non-empty row (their outputs are ignored) and SDPA never sees an all-masked row.
    """
    b, t = attention_mask.shape
    valid = attention_mask.bool()
    causal = torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal[None] & valid[:, None, :]
    allowed |= torch.eye(t, dtype=torch.bool, device=attention_mask.device)[None]
    return ~allowed[:, None]


def forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] tokens -> [B, T, V/tp] logits (or [B, T, 1] values for a scalar head).

    With sequence parallelism the sequence is split over TP ranks, so T is right-padded to
    a multiple of TP (padding is masked out and cut off again)."""
    t = input_ids.shape[1]
    split = sequence_split(model)
    extra = (split - t % split) % split
    if extra:
        input_ids = torch.nn.functional.pad(input_ids, (0, extra))
        attention_mask = torch.nn.functional.pad(attention_mask, (0, extra))
    out = model(input_ids, None, attention_mask_4d(attention_mask))
    if extra:
        from megatron.core import parallel_state

        if parallel_state.is_pipeline_last_stage():  # [B, T, ...]; earlier stages pass [T, B, H] on
            out = out[:, :t]
    return out


def sequence_split(model) -> int:
    """What sequence lengths must be a multiple of: TP with sequence parallelism, else 1."""
    config = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)
    return config.tensor_model_parallel_size if config is not None and config.sequence_parallel else 1


def response_slice(full, response_length: int) -> torch.Tensor:
    """Outputs that predict the response tokens: positions T-R-1 .. T-2 of a [B, T, ...]
    tensor or a PackedOutput."""
    from tandem.models.packing import take_positions

    t = full.shape[1]
    return take_positions(full, t - response_length - 1, response_length)
