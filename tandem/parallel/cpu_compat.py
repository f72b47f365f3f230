"""The megatron-core CPU shim: what makes megatron-core's CUDA assumptions hold on a CPU host.

megatron-core assumes CUDA in a few places (`torch.cuda.current_device()` for parameter
placement, `torch.cuda.synchronize()`, the CUDA RNG tracker, literal device="cuda" in the
optimizer, checkpointing and pipeline schedules, CUDA type names in the distributed optimizer).
On a host without CUDA, `install()` makes those calls answer for the CPU: GPTModel builds,
TP/PP/EP forward and backward run over gloo, and megatron's own optimizers (the distributed one
too) and schedules run unchanged. It touches nothing when CUDA is
present, and is installed once per process by `tandem.parallel.layout.init_distributed`.
"""
from __future__ import annotations

import contextlib

import torch

_installed = False


def install() -> None:
    """Make megatron-core's CUDA assumptions hold on a CPU-only host. Idempotent."""
    global _installed
    if torch.cuda.is_available() or _installed:
        return
    _installed = True
    torch.cuda.current_device = lambda: "cpu"  # parameters land on the CPU
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    _patch_rng_tracker()
    _patch_hard_coded_cuda()
    _patch_moe_alltoall()
    _patch_distributed_optimizer_types()


# megatron-core modules that create small tensors with a literal device="cuda"
# (optimizer scalars, grad-norm buffers, checkpoint exchange buffers).
_CUDA_LITERAL_MODULES = (
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.utils",  # local multi-tensor fallbacks (no Apex / Transformer Engine)
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",  # PP > 1: shapes and activations over gloo
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
)


class _CpuTorch:
    """`torch` as seen by those modules: device="cuda" means the CPU; all else is torch."""

    @staticmethod
    def _fix(kwargs):
        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda"):
            kwargs["device"] = "cpu"
        return kwargs

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("tensor", "zeros", "ones", "empty", "full", "arange"):
            return lambda *a, **k: attr(*a, **self._fix(k))
        return attr


def _patch_hard_coded_cuda() -> None:
    import importlib

    for name in _CUDA_LITERAL_MODULES:
        try:
            importlib.import_module(name).torch = _CpuTorch()
        except ImportError:  # absent in this megatron-core version
            pass
    torch.Tensor.cuda = lambda self, *a, **k: self  # "move to the GPU" = stay on the CPU
    from megatron.core.optimizer import optimizer as moptimizer

    moptimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu


def _clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron's clip_grad_by_total_norm_fp32 (same coefficient) minus its CUDA-type assert."""
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


class _CpuStream:
    """The one CPU "stream" (a class: transformers annotates with `torch.cuda.Stream | None`):
    work is already ordered, so waits and events are no-ops."""
    _one = None

    def __new__(cls, *args, **kwargs):
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return self

    def synchronize(self):
        pass


def _patch_moe_alltoall() -> None:
    """megatron's MoE alltoall token dispatcher copies split sizes to the host (as numpy, which
    all_to_all_single takes) on a side stream. On CPU the side stream is the current one, and
    the sizes, already host tensors, still become numpy."""
    torch.cuda.Stream = _CpuStream
    torch.cuda.current_stream = _CpuStream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    from megatron.core.transformer.moe import token_dispatcher

    def to_host(tensor, as_numpy=False, record_stream=False):
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host


def _patch_distributed_optimizer_types() -> None:
    """megatron's DistributedOptimizer sorts parameters by `param.type()` strings
    ('torch.cuda.FloatTensor', ...) while it builds its shards; while it does, a CPU tensor's
    type() answers the CUDA name of its dtype."""
    import functools

    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    plain_type, init = torch.Tensor.type, cls.__init__

    def cuda_named_type(self, *args, **kwargs):
        name = plain_type(self, *args, **kwargs)
        return name.replace("torch.", "torch.cuda.", 1) if not args and not kwargs and not self.is_cuda else name

    @functools.wraps(init)
    def build(self, *args, **kwargs):
        torch.Tensor.type = cuda_named_type
        try:
            init(self, *args, **kwargs)
        finally:
            torch.Tensor.type = plain_type

    cls.__init__ = build


def _patch_rng_tracker() -> None:
    """megatron's CudaRNGStatesTracker swaps CUDA RNG states; on CPU swap the CPU state."""
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        def add(self, name, seed):
            if name in self.states_:
                raise Exception(f"cuda rng state {name} already exists")
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)
            self.seeds_.add(seed)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"cuda rng state {name} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # activation recomputation (override_transformer_config.recompute_*) saves and restores the
    # device's RNG state around a layer; on a CPU host the device's generator is the CPU's
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
