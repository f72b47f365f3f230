"""The compiled layers' matmul `x @ weight.T`, whose weight gradient goes straight into megatron's fp32
`weight.main_grad` (what megatron's gradient_accumulation_fusion does with Apex's kernel).

Otherwise autograd makes each weight gradient in bf16 and megatron DDP's hook adds it into the fp32
buffer, once per micro-batch: a pass over every weight's bf16 and fp32 gradient, the largest cost of
a 7B update after its GEMMs (bench/results/offload.md). Here the backward's GEMM adds
its product into the buffer itself (cuBLAS with an fp32 output, `addmm(out_dtype=...)`), marks the
weight `grad_added_to_main_grad` so the hook skips its add (megatron's own convention), and hands
autograd an uninitialised gradient to drop. A weight without `main_grad` (no DDP: the reference, a
bare model) gets its gradient the usual way.

They are torch.library custom ops, not an autograd.Function, so the compiled layer stays one graph
that AOTAutograd may cache on disk (tandem/models/compile.py); the compiler sees a pure op with a
gradient-shaped result, and `main_grad` only inside it."""
from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("tandem::matmul_wt", mutates_args=())
def matmul_wt(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., in] @ weight [out, in].T -> [..., out]."""
    return torch.matmul(x, weight.t())


@matmul_wt.register_fake
def _(x, weight):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("tandem::weight_grad", mutates_args=())
def weight_grad(weight: Tensor, grad_out: Tensor, x: Tensor) -> Tensor:
    """The weight's gradient sum(grad_out^T x) over tokens: added into weight.main_grad where it has one
    (the result is then a placeholder to drop), else returned."""
    dy, inp = grad_out.reshape(-1, grad_out.shape[-1]).t(), x.reshape(-1, x.shape[-1])
    main = getattr(weight, "main_grad", None)
    if main is None:
        return dy @ inp
    if main.dtype == dy.dtype:
        main.addmm_(dy, inp)
    elif main.is_cuda:
        torch.addmm(main, dy, inp, out_dtype=main.dtype, out=main)
    else:  # CPU has no mixed-precision addmm
        main.add_(dy @ inp)
    weight.grad_added_to_main_grad = True  # megatron DDP's hook: already in main_grad, do not add
    return torch.empty_like(weight)


@weight_grad.register_fake
def _(weight, grad_out, x):
    return torch.empty_like(weight)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    dx = torch.matmul(grad_out, weight) if ctx.needs_input_grad[0] else None
    dw = torch.ops.tandem.weight_grad(weight, grad_out, x) if ctx.needs_input_grad[1] else None
    return dx, dw


matmul_wt.register_autograd(_backward, setup_context=_setup)
