"""Build megatron-core GPTModels: the policy (LM head) and value models (scalar head)."""
from __future__ import annotations

import torch

from tandem.dist import device
from tandem.models.spec import ModelShape, transformer_config


class ScalarHead(torch.nn.Linear):
    """hidden -> 1 value per token; replicated across TP ranks (its input is not split).

    Called by GPTModel like its output_layer: returns (output, bias=None).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__(hidden_size, 1, bias=False, dtype=dtype)
        torch.nn.init.zeros_(self.weight)  # value starts at 0: no spurious early advantages

    def forward(self, hidden, weight=None, runtime_gather_output=None, **kwargs):
        return super().forward(hidden), None


def layer_spec():
    """megatron's local layer spec (SwiGLU MLP) with SDPA core attention and an RMSNorm that
    supports sequence parallelism."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from tandem.models.attention import SDPAttention
    from tandem.models.norm import RMSNorm

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    return spec


def block_spec(config):
    """This pipeline stage's layers plus the final norm (ours, for sequence parallelism)."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    from tandem.models.norm import RMSNorm

    return TransformerBlockSubmodules(layer_specs=[layer_spec()] * get_num_layers_to_build(config),
                                      layer_norm=RMSNorm)


def build_gpt_model(shape: ModelShape, *, head: str = "lm", tp: int = 1, pp: int = 1,
                    params_dtype: torch.dtype = torch.float32, sequence_parallel: bool = False):
    """A megatron-core GPTModel on this rank's device. head: "lm" or "scalar"."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if head not in ("lm", "scalar"):
        raise ValueError(f"head must be 'lm' or 'scalar', got {head!r}")
    config = transformer_config(shape, tp=tp, pp=pp, params_dtype=params_dtype,
                                sequence_parallel=sequence_parallel and tp > 1)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(config),
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=shape.tie_word_embeddings and head == "lm",
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    if head == "scalar" and model.post_process:
        model.output_layer = ScalarHead(shape.hidden_size, params_dtype)
    # The local spec's torch norms are created in fp32; megatron's mixed-precision optimizer
    # expects every parameter in params_dtype (as Megatron-LM's Float16Module casts them).
    for param in model.parameters():
        param.data = param.data.to(params_dtype)
    return model.to(device.device())
