"""Scalar-head models (a GPTModel trunk + one value per token): the critic's value model and the
reward model (a Hugging Face XForSequenceClassification) share this.

- `ScalarHead`: hidden -> 1, in place of the LM head;
- `build_scalar_model`: the GPTModel with it, in a role's megatron layout (+ compiled layers on GPUs);
- reading it: `token_values` (per position, the critic's values) and `sequence_scores` (one score
  per row at its last non-pad token, as transformers' sequence classification computes it).

Deliberately not here: losses (tandem/train/losses.py), loading weights (tandem/convert/hf_load.py
loads a sequence-classification checkpoint through the model registry's table).
"""
from __future__ import annotations

import torch

from tandem.models.packing import take_positions


class ScalarHead(torch.nn.Linear):
    """hidden -> 1 value per token; replicated across TP ranks.

    Called by GPTModel like its output_layer: returns (output, bias=None). With sequence
    parallelism the trunk's output is split along the sequence over TP: the head gathers it, so
    every TP rank computes every token's value as without it (the gather's backward hands each
    rank its own part of the gradient, and the head's weight gradient is whole on every rank).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool = False):
        super().__init__(hidden_size, 1, bias=False, dtype=dtype)
        torch.nn.init.zeros_(self.weight)  # value starts at 0: no spurious early advantages
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden, weight=None, runtime_gather_output=None, **kwargs):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return super().forward(hidden), None


def build_scalar_model(shape, megatron, use_torch_compile: bool = False, overrides: dict | None = None,
                       weights_follow: bool = False):
    """A GPTModel with a ScalarHead in the layout `megatron` (a MegatronConfig: TP, PP, EP, dtype,
    sequence parallelism); its layers torch.compile'd on GPUs when `use_torch_compile`. overrides:
    TransformerConfig fields from the role's override_transformer_config. weights_follow: the trunk
    is loaded before use (build_gpt_model's); the value head still starts at zero."""
    from tandem.models.build import build_gpt_model
    from tandem.models.compile import compile_layers
    from tandem.parallel import device

    m = megatron
    model = build_gpt_model(shape, head="scalar", tp=m.tensor_model_parallel_size,
                            pp=m.pipeline_model_parallel_size, ep=m.expert_model_parallel_size,
                            params_dtype=device.parse_dtype(m.dtype), sequence_parallel=m.sequence_parallel,
                            overrides=overrides, weights_follow=weights_follow)
    if use_torch_compile and device.has_cuda():
        compile_layers(model)
    return model


def token_values(output, first: int, width: int) -> torch.Tensor:
    """Scalar-head output ([B, T, 1] or a PackedOutput) at padded positions first.. -> [B, width] fp32."""
    return take_positions(output, first, width).squeeze(-1).float()


def last_token_index(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     pad_token_id: int | None) -> torch.Tensor:
    """[B] index of each row's last real token that is not `pad_token_id` (transformers'
    XForSequenceClassification reads its score there); rows with none: their last real token."""
    real = attention_mask.bool()
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    last_real = torch.where(real, positions, -1).amax(-1)
    if pad_token_id is None:
        return last_real
    not_pad = real & (input_ids != pad_token_id)
    last_not_pad = torch.where(not_pad, positions, -1).amax(-1)
    return torch.where(last_not_pad >= 0, last_not_pad, last_real)


def sequence_scores(output, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    pad_token_id: int | None) -> torch.Tensor:
    """Scalar-head output over [B, T] rows -> [B] fp32 scores at `last_token_index`."""
    index = last_token_index(input_ids.cpu(), attention_mask.cpu(), pad_token_id)
    values = token_values(output, 0, input_ids.shape[1])  # [B, T]
    return values.gather(1, index.to(values.device)[:, None]).squeeze(1)
