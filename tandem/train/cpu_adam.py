"""megatron-core's CPU optimizer offload (HybridDeviceOptimizer) with its fp32 weights in pinned memory.

For the share of Adam it runs on the CPU, megatron keeps an fp32 copy of each parameter in host
memory and, after each CPU step, copies it back to the GPU parameter. It pins the bf16 copy it
makes first but not the fp32 one the CPU Adam updates (`_get_sub_optimizer_param_groups`:
`.cpu().pin_memory()`, then `.float()`), so every copy back is from pageable memory: CUDA waits
for the copy stream to drain and stages the bytes through its own buffer while the host blocks,
in series with the CPU Adam of the next parameter. Pinned, the copies run on megatron's copy
stream beside the CPU Adam. Applied after construction and after every state load (megatron
rebuilds the copies then).

Deliberately not here: what megatron's offload does otherwise (its own module), which share runs
on the CPU (optim.override_optimizer_config.optimizer_offload_fraction).
"""
from __future__ import annotations


def hybrid_optimizers(torch_optimizers: list) -> list:
    """The HybridDeviceOptimizers among the torch optimizers megatron's optimizers wrap."""
    try:
        from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    except ImportError:  # pragma: no cover - a megatron-core without CPU offload
        return []
    return [o for o in torch_optimizers if isinstance(o, HybridDeviceOptimizer)]


def pin_cpu_share(hybrid) -> int:
    """Move the CPU optimizers' parameters (the fp32 copies) into pinned memory, keeping each
    tensor object (the optimizer and megatron's maps hold them). -> bytes newly pinned."""
    moved = 0
    for cpu_opt in hybrid.cpu_optimizers:
        for group in cpu_opt.param_groups:
            for p in group["params"]:
                if not p.is_pinned():  # a state load rebuilds them pageable
                    p.data = p.data.pin_memory()
                    moved += p.numel() * p.element_size()
    return moved


def pin_after_every_load(hybrid) -> None:
    """pin_cpu_share now and after every load_state_dict (registered after megatron's own hook,
    which rebuilds the CPU copies)."""
    pin_cpu_share(hybrid)
    hybrid.register_load_state_dict_post_hook(pin_cpu_share)
