"""Regional torch.compile of a GPTModel's transformer layers (training and scoring on GPUs).

Without Transformer Engine, megatron's local layer is ~60 small kernels forward and ~120
backward (unfused RMSNorm, RoPE, bias adds, casts, transposes), so a 0.5B model's step is
bound by kernel launches and Python, not by the GPU. Compiling each TransformerLayer
fuses those into a few Triton kernels around the GEMMs and attention. Every layer runs the
same code on parameters of the same shapes, so one compiled graph serves them all
(dynamo treats module parameters as inputs); shapes are dynamic because packed
micro-batches change their token count every step. Only the layers are compiled: the
embedding, the LM head, the loss and megatron's schedule and DDP hooks stay eager.

So that a later run loads these graphs from torch's on-disk caches instead of compiling them again,
no torch.autograd.Function should be in them (AOTAutograd's cache refuses those by default): the
compiled layers' linears get a plain matmul forward where they have nothing to communicate (a custom op
whose backward adds the weight gradient into megatron's fp32 main_grad), and their MLP the unfused
activation. The Functions that remain (shared-prompt attention, megatron's
tensor-parallel mappings) are marked cacheable under a key of their sources' versions
(`cache_autograd_functions`). And every layer gets its input with the same strides (one graph for
all, the first too).

A layer called with an inference context (generation on the megatron modules: KV cache,
CUDA graphs of its own) runs eagerly. If compiling fails, every layer falls back to eager
with a warning, as `nn.Module.compile` alone would not.
"""
from __future__ import annotations

import copy
import logging
import warnings

import torch

from tandem.models.main_grad_linear import matmul_wt

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
        hidden = kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor):
            kwargs["hidden_states"] = _canonical(hidden)
        try:
            return self.compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:  # a compiler bug must not stop training
            log.warning("torch.compile of the transformer layers failed, running them eagerly: %s", e)
            _CompiledCall.failed = True
            return self.eager(*args, **kwargs)


def _canonical(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states as every layer after the first receives them: not a view, the strides of a
    contiguous tensor. The embedding's output is a transpose (its size-1 batch dimension has
    stride T*H, and it has a `_base`); dynamo guards on both, so the first layer would compile
    graphs of its own (twice the compile time, and one more guard set to check on every call).
    The copy is one [T, H] tensor per forward; gradients flow through it."""
    strides, step = [], 1
    for size in reversed(hidden.shape):
        strides.insert(0, step)
        step *= max(size, 1)
    if hidden._base is None and hidden.stride() == tuple(strides):
        return hidden
    return hidden.clone(memory_format=torch.contiguous_format)


def compile_layers(model) -> int:
    """Compile every TransformerLayer of `model` in place. -> how many."""
    from megatron.core.transformer.transformer_layer import TransformerLayer
    from megatron.core.utils import unwrap_model

    layers = [m for m in unwrap_model(model).modules() if isinstance(m, TransformerLayer)]
    for layer in layers:
        if not isinstance(layer._compiled_call_impl, _CompiledCall):
            layer._compiled_call_impl = _CompiledCall(layer)
            plain_linears(layer)
            plain_activation(layer)
    raise_recompile_limit(16)  # graphs are keyed by code, not layer: grad mode, dtype, layout variants
    specialize_floats()
    cache_autograd_functions()
    _quiet_megatron_warnings()
    return len(layers)


def plain_linears(layer) -> int:
    """Give the layer's column- and row-parallel linears a plain matmul forward where they have
    nothing to communicate (one TP rank, no sequence parallelism or expert communication, no fused
    gradient accumulation, no deferred or offloaded activations). megatron's forward runs the
    same matmul and bias add inside torch.autograd.Functions (one per linear, and the identity
    copy / reduce regions), which AOTAutograd's on-disk cache refuses: every run traced and
    partitioned the training graph again (~40 s of a 0.5B first step with a warm cache). Same
    arithmetic; the weight gradient goes straight into megatron's fp32 main_grad
    (tandem/models/main_grad_linear.py). -> how many linears."""
    from megatron.core import tensor_parallel as tpl

    n = 0
    for m in layer.modules():
        kind = ("column" if type(m) is tpl.ColumnParallelLinear else
                "row" if type(m) is tpl.RowParallelLinear else None)
        if kind is None or not _communication_free(m):
            continue
        m.forward = (_column_forward if kind == "column" else _row_forward).__get__(m)
        n += 1
    return n


def plain_activation(layer) -> bool:
    """The layer's MLP without megatron's fused SwiGLU / GeLU (bias_activation_fusion): that fusion is
    an autograd.Function too (AOTAutograd's cache refuses it, as above), and inductor fuses the plain
    activation into one kernel each way anyway. The MLP gets its own copy of the config; eager calls
    of the layer (generation's prefill) run the plain activation as well. -> whether it changed."""
    mlp = getattr(layer, "mlp", None)
    config = getattr(mlp, "config", None)
    if config is None or not getattr(config, "bias_activation_fusion", False) or not hasattr(mlp, "linear_fc1"):
        return False
    mlp.config = copy.copy(config)
    mlp.config.bias_activation_fusion = False
    return True


def _communication_free(linear) -> bool:
    from megatron.core import parallel_state

    cfg = linear.config
    tp_group = getattr(linear, "tp_group", None)
    tp = tp_group.size() if tp_group is not None else parallel_state.get_tensor_model_parallel_world_size()
    return (tp == 1 and not linear.sequence_parallel and not getattr(linear, "explicit_expert_comm", False)
            and not linear.gradient_accumulation_fusion and not cfg.defer_embedding_wgrad_compute
            and cfg._cpu_offloading_context is None and linear.weight is not None)


def _column_forward(self, input_, weight=None, runtime_gather_output=None):
    weight = self.weight if weight is None else weight
    output = matmul_wt(input_, weight)  # as megatron's LinearWithGradAccumulation...: then + bias
    if self.bias is not None and not self.skip_bias_add:
        output = output + self.bias
    return output, (self.bias if self.skip_bias_add else None)


def _row_forward(self, input_):
    output = matmul_wt(input_, self.weight)
    if self.skip_bias_add:
        return output, self.bias
    return (output + self.bias if self.bias is not None else output), None


def raise_recompile_limit(n: int) -> None:
    """At least n compiled variants per function before dynamo falls back to eager
    (`recompile_limit`, `cache_size_limit` before torch 2.6)."""
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), n))


def cache_autograd_functions() -> None:
    """Let AOTAutograd's and inductor's on-disk caches keep graphs holding a torch.autograd.Function
    (torch refuses them unless marked: a Function's Python may change without the graph's key
    changing), under a key of the versions of the code those Functions come from: torch, megatron-core
    (its tensor-parallel mappings) and tandem's shared-prompt attention (its source's hash). Without
    it, each run with `share_prompts` traced its layers' forward and backward again (~3.5 s of a warm
    0.5B run's first step on an H200)."""
    import hashlib

    import megatron.core
    from torch._inductor import config

    from tandem.models import shared_prompt_attention

    with open(shared_prompt_attention.__file__, "rb") as f:
        source = hashlib.sha256(f.read()).hexdigest()[:16]
    key = f"torch {torch.__version__}; megatron-core {megatron.core.__version__}; shared_prompt_attention {source}"
    config.unsafe_marked_cacheable_functions = {**config.unsafe_marked_cacheable_functions, _AUTOGRAD_FUNCTION: key}


_AUTOGRAD_FUNCTION = "torch.ops.higher_order.autograd_function_apply"  # dynamo's operator for any Function's apply


def specialize_floats() -> None:
    """Python floats as constants of the compiled graphs, guarded on their values. torch's default
    (`specialize_float=False`) makes each float a layer reads (layernorm eps, softmax scale, dropout
    rate, the sampler's temperature, ...) a 0-d CPU tensor input: on a GPU that puts C++ CPU
    kernels into the graphs, and loading those from the cache made inductor check the host's vector
    ISA by building and loading test libraries in subprocesses, most of a warm process's first
    compile (bench/results/e2e_step.md). The values do not change within a run, so nothing
    recompiles."""
    torch._dynamo.config.specialize_float = True


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
