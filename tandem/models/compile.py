"""Regional torch.compile of a GPTModel's transformer layers (training and scoring on GPUs).

Without Transformer Engine, megatron's local layer is ~60 small kernels forward and ~120
backward (unfused RMSNorm, RoPE, bias adds, casts, transposes), so a 0.5B model's step is
bound by kernel launches and Python, not by the GPU. Compiling each TransformerLayer
fuses those into a few Triton kernels around the GEMMs and attention. Every layer runs the
same code on parameters of the same shapes, so one compiled graph serves them all
(dynamo treats module parameters as inputs); shapes are dynamic because packed
micro-batches change their token count every step. Only the layers are compiled: the
embedding, the LM head, the loss and megatron's schedule and DDP hooks stay eager.

A layer called with an inference context (generation on the megatron modules: KV cache,
CUDA graphs of its own) runs eagerly. If compiling fails, every layer falls back to eager
with a warning, as `nn.Module.compile` alone would not.
"""
from __future__ import annotations

import logging
import warnings

import torch

log = logging.getLogger(__name__)


class _CompiledCall:
    """A layer's `_compiled_call_impl` (what nn.Module.__call__ runs when it is set): the
    compiled `_call_impl`, except for inference-context calls and after a failed compile."""

    failed = False  # shared: one failure sends every layer back to eager

    def __init__(self, layer: torch.nn.Module):
        self.eager = layer._call_impl
        self.compiled = torch.compile(layer._call_impl, dynamic=True)  # as nn.Module.compile

    def __call__(self, *args, **kwargs):
        generating = kwargs.get("inference_context") is not None or kwargs.get("inference_params") is not None
        if generating or _CompiledCall.failed:
            return self.eager(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:  # a compiler bug must not stop training
            log.warning("torch.compile of the transformer layers failed, running them eagerly: %s", e)
            _CompiledCall.failed = True
            return self.eager(*args, **kwargs)


def compile_layers(model) -> int:
    """Compile every TransformerLayer of `model` in place. -> how many."""
    from megatron.core.transformer.transformer_layer import TransformerLayer
    from megatron.core.utils import unwrap_model

    layers = [m for m in unwrap_model(model).modules() if isinstance(m, TransformerLayer)]
    for layer in layers:
        if not isinstance(layer._compiled_call_impl, _CompiledCall):
            layer._compiled_call_impl = _CompiledCall(layer)
    raise_recompile_limit(16)  # graphs are keyed by code, not layer: grad mode, dtype, layout variants
    _quiet_megatron_warnings()
    return len(layers)


def raise_recompile_limit(n: int) -> None:
    """At least n compiled variants per function before dynamo falls back to eager
    (`recompile_limit`, `cache_size_limit` before torch 2.6)."""
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), n))


class _WarningsOutsideCompile:
    """`warnings` as megatron.core.utils sees it. megatron 0.19's RowParallelLinear passes
    tp_group=None on every call and `get_tensor_model_parallel_group_if_none` then warns;
    dynamo cannot trace `warnings.warn` with a warning class (a graph break in every layer,
    forward and backward). Inside a compiled region the warning is dropped; outside it is
    issued as before."""

    def __getattr__(self, name):
        return getattr(warnings, name)

    @staticmethod
    def warn(*args, **kwargs):
        if not torch.compiler.is_compiling():
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            warnings.warn(*args, **kwargs)


def _quiet_megatron_warnings() -> None:
    from megatron.core import utils

    if isinstance(getattr(utils, "warnings", None), type(warnings)):
        utils.warnings = _WarningsOutsideCompile()
