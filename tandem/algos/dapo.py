"""DAPO (Yu et al. 2025, arXiv:2503.14476) pieces that are pure tensor math.

* ``compute_overlong_penalty``: the soft overlong punishment of the DAPO paper
  (verl's ``reward_model.overlong_buffer``), added to each row's score.
* ``varied_group_mask``: which rows belong to a prompt group whose metric is not
  constant (the dynamic-sampling filter of verl's ``algorithm.filter_groups``).

Deliberately not here: generating more batches until one is full (the
controller's loop, ``controller/dapo.py``), and the token-mean loss (that is
``loss_agg_mode="token-mean"`` in ``tandem.algos.aggregate``).
"""

import torch

from tandem.algos.advantages import GroupIndex, _group_stats


def compute_overlong_penalty(
    response_length: torch.Tensor,
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float,
) -> torch.Tensor:
    """Soft overlong punishment: 0 up to ``L_max - buffer_len`` tokens, then linear down to ``-penalty_factor``.

    ``expected = max_response_length - buffer_len``;
    ``penalty = min(-(length - expected) / buffer_len * penalty_factor, 0)``.
    A response of exactly ``max_response_length`` tokens gets ``-penalty_factor``.

    Args:
        response_length: ``[B]`` number of real response tokens per row (EOS included).
        max_response_length: the generation limit ``L_max``.
        buffer_len: length of the punishment interval, ``0 < buffer_len <= L_max``.
        penalty_factor: penalty at ``L_max`` (>= 0).

    Returns:
        float32 ``[B]``, <= 0.

    Raises:
        ValueError: ``buffer_len`` outside ``(0, max_response_length]``.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(f"overlong buffer_len must be in (0, {max_response_length}], got {buffer_len}")
    expected = max_response_length - buffer_len
    exceed = response_length.to(torch.float32) - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def varied_group_mask(values: torch.Tensor, index: GroupIndex) -> torch.Tensor:
    """Rows to keep for dynamic sampling: those whose group's ``values`` are not all equal.

    As in verl, a group of a single row is kept (its std is undefined, not 0).

    Args:
        values: float ``[B]`` per-row metric (e.g. the verifier score).
        index: group ids, LongTensor ``[B]`` or ``B`` hashables.

    Returns:
        bool ``[B]``.
    """
    _, std, size = _group_stats(values.to(torch.float64), index)
    return (std > 0) | (size == 1)
