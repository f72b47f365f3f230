"""Masked reductions and loss aggregation over token-level tensors.

Conventions used across ``tandem.algos``:

* token-level tensors are ``[B, R]`` (B rows, R = padded response length);
* a mask has the same shape as the values it filters (bool or float); a
  non-zero entry marks a real token, zero marks padding (or a token that must
  not count, e.g. a tool observation in a multi-turn response).

Masked-out positions are removed with ``torch.where`` rather than multiplied by
zero, so NaN or inf sitting in padding (uninitialised values, ``-inf`` log-probs)
never leaks into a result. A float mask is used as a weight on kept positions.

Deliberately not here: anything distributed. ``agg_loss`` normalises by the
tokens/rows of the tensor it is given; a global normaliser across data-parallel
ranks or micro-batches is the training step's job.
"""

import torch

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _kept(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` weighted by ``mask``, with exact zeros where the mask is zero."""
    mask = torch.broadcast_to(mask, values.shape)
    if mask.dtype == torch.bool:
        return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    weighted = values * mask.to(values.dtype)
    return torch.where(mask != 0, weighted, torch.zeros((), dtype=values.dtype, device=values.device))


def _count(values: torch.Tensor, mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Sum of mask weights, in ``values``' dtype, over ``dim`` (all dims if None)."""
    weights = torch.broadcast_to(mask, values.shape).to(values.dtype)
    return weights.sum() if dim is None else weights.sum(dim=dim)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over positions where ``mask`` is non-zero.

    Args:
        values: float tensor of any shape, e.g. ``[B, R]``.
        mask: bool or float tensor, same shape as ``values`` (or broadcastable);
            non-zero = include (a float mask weights the value), zero = ignore.
        dim: dimension to reduce; ``None`` reduces everything to a 0-d tensor.

    Returns:
        Tensor of ``values``' dtype: 0-d if ``dim`` is None, else ``values``'
        shape without ``dim`` (``[B]`` for ``dim=-1`` on ``[B, R]``).
        An all-zero mask gives 0.
    """
    kept = _kept(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is non-zero.

    Args:
        values: float tensor of any shape, e.g. ``[B, R]``.
        mask: bool or float tensor, same shape as ``values`` (or broadcastable);
            non-zero = include, zero = ignore. A float mask gives a weighted mean.
        dim: dimension to reduce; ``None`` reduces everything.

    Returns:
        Tensor of ``values``' dtype shaped like ``masked_sum``'s result.
        A slice with no masked-in element gives 0, not NaN (verl adds 1e-8 to the
        count; we clamp instead so that non-empty means are exact).
    """
    count = _count(values, mask, dim)
    return masked_sum(values, mask, dim) / count.clamp_min(torch.finfo(values.dtype).tiny)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all masked-in positions (one global number).

    Args:
        values: float tensor of any shape, e.g. ``[B, R]``.
        mask: bool or float tensor, same shape as ``values``; non-zero = include.
        unbiased: apply Bessel's correction ``n / (n - 1)`` with ``n`` = mask sum
            (as ``torch.var``).

    Returns:
        0-d tensor of ``values``' dtype.

    Raises:
        ValueError: the mask is empty, or has a single element with
            ``unbiased=True`` (division by zero). Checking this syncs with the
            device once.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = _count(values, mask, None)
        n_host = float(n)
        if n_host == 0:
            raise ValueError("masked_var: the mask selects no element")
        if n_host == 1:
            raise ValueError("masked_var: the mask selects one element; unbiased variance divides by zero")
        var = var * (n / (n - 1))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the mask.

    ``(values - mean) / sqrt(var + 1e-8)`` with ``mean`` and (unbiased) ``var``
    taken over all masked-in positions of the whole tensor; with
    ``shift_mean=False`` the mean is added back (only the scale changes).

    Args:
        values: float tensor, e.g. ``[B, R]``.
        mask: bool or float tensor, same shape; non-zero = include in statistics.
        shift_mean: subtract the mean (True) or keep it (False).

    Returns:
        Tensor shaped and typed like ``values``. Every position is transformed,
        including masked-out ones; callers zero those if they need to.

    Raises:
        ValueError: fewer than two masked-in elements (see ``masked_var``).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Reduce a token-level loss matrix to a scalar (verl's ``loss_agg_mode``).

    Args:
        loss_mat: float ``[B, R]`` per-token loss.
        loss_mask: bool or float ``[B, R]``; non-zero = the token counts.
        loss_agg_mode: one of

            * ``"token-mean"``: sum over all kept tokens / number of kept tokens;
            * ``"seq-mean-token-sum"``: per-row sum, then mean over rows;
            * ``"seq-mean-token-mean"``: per-row mean, then mean over rows;
            * ``"seq-mean-token-sum-norm"``: sum over all kept tokens / (B * R),
              Dr.GRPO's constant normaliser (R is the padded length of this
              tensor, so pad to a fixed length if the normaliser must not vary).
              Note: verl divides by R only; Tandem divides by B * R so the loss
              scale does not grow with the batch.

    Returns:
        0-d tensor of ``loss_mat``'s dtype, differentiable w.r.t. ``loss_mat``.
        Rows whose mask is all zero are left out of the two seq-mean modes (verl
        would give NaN for seq-mean-token-mean and count them for
        seq-mean-token-sum); if no token is kept at all the loss is 0.

    Raises:
        ValueError: unknown ``loss_agg_mode`` (the message lists the known ones).
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        if loss_agg_mode == "seq-mean-token-sum":
            seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # [B]
        else:
            seq_losses = masked_mean(loss_mat, loss_mask, dim=-1)  # [B]
        seq_has_tokens = _count(loss_mat, loss_mask, dim=-1) != 0  # [B]
        return masked_mean(seq_losses, seq_has_tokens)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        num_rows, response_length = loss_mat.shape[0], loss_mat.shape[-1]
        return masked_sum(loss_mat, loss_mask) / max(num_rows * response_length, 1)
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; known modes: {list(LOSS_AGG_MODES)}")
