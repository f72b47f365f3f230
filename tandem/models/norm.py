"""RMSNorm for megatron layer specs that also works with sequence parallelism.

megatron-core's local spec builds torch norms through WrappedTorchNorm, which refuses
sequence parallelism. Under SP each TP rank normalises its slice of the sequence, so the
weight's gradient is a partial sum: marking the weight `sequence_parallel` makes
megatron's finalize_model_grads sum it over the TP group. Parameter names are torch's
(`weight`), so checkpoints and the Hugging Face mapping do not change.
"""
from __future__ import annotations

import contextlib

import torch


class RMSNorm(torch.nn.RMSNorm):
    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel


# flags megatron copies from config.sequence_parallel at construction
_SP_FLAGS = ("sequence_parallel", "reduce_scatter_embeddings")


@contextlib.contextmanager
def sequence_parallel_off(model):
    """Run the model without SP inside the block (generation: a decode step has one token
    per row, nothing to split). megatron reads the flag from the shared config and from the
    copies its TP linear layers and vocab embedding made at construction."""
    config = model.config
    if not config.sequence_parallel:
        yield
        return
    switched = [(m, f) for m in model.modules() for f in _SP_FLAGS if getattr(m, f, None) is True]
    config.sequence_parallel = False
    for m, f in switched:
        setattr(m, f, False)
    try:
        yield
    finally:
        config.sequence_parallel = True
        for m, f in switched:
            setattr(m, f, True)
