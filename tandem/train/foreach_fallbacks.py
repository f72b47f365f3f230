"""torch's foreach kernels in place of megatron-core's one-tensor-at-a-time fallbacks.

Without Transformer Engine or Apex, megatron's optimizer falls back to loops in
`megatron.core.utils`: the grad norm takes `torch.norm` of each gradient and builds the
total with `torch.tensor([...])` over those device scalars (one host sync per parameter,
about 300 for a 0.5B model), clipping scales each gradient with a temporary, and bf16
models copy every fp32 main weight back to its parameter in its own `copy_`. These are
the same operations through torch's multi-tensor (`torch._foreach_*`) kernels: a few
launches and no sync. Installed once per process; a no-op when TE or Apex is in use.
"""
from __future__ import annotations

import torch

_replaced: list = []  # (module, attribute, megatron's function): what uninstall() puts back


def l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for amp_C.multi_tensor_l2norm (per_tensor=False): ([total norm], None)."""
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def scale(chunk_size, noop_flag, tensor_lists, factor):
    """Drop-in for amp_C.multi_tensor_scale: dst = src * factor for each pair."""
    src, dst = tensor_lists
    if not src:
        return
    if all(s is d for s, d in zip(src, dst)):
        torch._foreach_mul_(dst, factor)
    elif factor == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, factor))


def copy_this_to_that(this, that, overflow_buf=None):
    """Drop-in for megatron's _multi_tensor_copy_this_to_that (bf16: main weights -> params)."""
    if this:
        torch._foreach_copy_(that, this)


def install() -> bool:
    """Swap megatron's local fallbacks for the foreach versions. -> whether they were swapped."""
    if _replaced:
        return True
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    if clip_grads.l2_norm_impl is not utils.local_multi_tensor_l2_norm:
        return False  # Transformer Engine's or Apex's fused kernels
    for module, name, ours in ((clip_grads, "l2_norm_impl", l2_norm), (clip_grads, "multi_tensor_scale_impl", scale),
                               (optimizer, "multi_tensor_scale_impl", scale),
                               (optimizer, "_multi_tensor_copy_this_to_that", copy_this_to_that)):
        _replaced.append((module, name, getattr(module, name)))
        setattr(module, name, ours)
    return True


def uninstall() -> None:
    """megatron's loops back (to compare against them)."""
    while _replaced:
        module, name, theirs = _replaced.pop()
        setattr(module, name, theirs)
