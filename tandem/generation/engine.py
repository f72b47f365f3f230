"""Batched generation with a KV cache on a megatron-core GPTModel.

The cache is megatron's StaticInferenceContext (preallocated [max_seq, batch, ...] per
layer). Prompts are left-padded so every row's last prompt token sits at the same
position; the prefill runs the whole prompt block once, then each decode step feeds one
token per row with a mask over the valid cache positions.

Not here yet (see the rollout-engine issue): CUDA graphs, continuous refill of finished
rows, shared prefill for the n samples of a prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.dist import device
from tandem.generation.sampling import SamplingParams, sample
from tandem.models.forward import attention_mask_4d


@dataclass
class GenerationResult:
    prompts: torch.Tensor  # [N, Lp] left-padded with pad_id
    prompt_mask: torch.Tensor  # [N, Lp] 1 = real token
    responses: torch.Tensor  # [N, R] right-padded with pad_id, R = max_new_tokens
    response_mask: torch.Tensor  # [N, R] 1 up to and including the stop token
    rollout_log_probs: torch.Tensor  # [N, R] fp32, 0 on padding


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


class GenerationEngine:
    def __init__(self, model, *, pad_id: int, eos_id: int, vocab_size: int,
                 max_batch_size: int = 512):
        self.model = model
        self.pad_id, self.eos_id, self.vocab_size = pad_id, eos_id, vocab_size
        self.max_batch_size = max_batch_size

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationResult:
        """Each prompt is sampled params.n times; rows are prompt-major (p0 s0, p0 s1, ...)."""
        params.validate(self.vocab_size)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        rows = [p for p in prompts for _ in range(params.n)]
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device.device()).manual_seed(params.seed)
        parts = [self._generate_chunk(rows[i:i + self.max_batch_size], params, generator)
                 for i in range(0, len(rows), self.max_batch_size)]
        if len(parts) == 1:
            return parts[0]
        width = max(p.prompts.shape[1] for p in parts)
        def pad_left(t, value):
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)
        return GenerationResult(
            prompts=torch.cat([pad_left(p.prompts, self.pad_id) for p in parts]),
            prompt_mask=torch.cat([pad_left(p.prompt_mask, 0) for p in parts]),
            responses=torch.cat([p.responses for p in parts]),
            response_mask=torch.cat([p.response_mask for p in parts]),
            rollout_log_probs=torch.cat([p.rollout_log_probs for p in parts]))

    @torch.no_grad()
    def _generate_chunk(self, rows, params, generator) -> GenerationResult:
        from megatron.core.inference.contexts import StaticInferenceContext

        dev = device.device()
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        n, lp = prompt_ids.shape
        r = params.max_new_tokens
        ctx = StaticInferenceContext(max_batch_size=n, max_sequence_length=lp + r)
        stop_ids = torch.tensor(sorted({self.eos_id, *params.stop_token_ids}), device=dev)

        tokens_out = torch.full((n, r), self.pad_id, dtype=torch.long, device=dev)
        logp_out = torch.zeros((n, r), dtype=torch.float32, device=dev)
        alive = torch.ones(n, dtype=torch.bool, device=dev)
        lengths = torch.zeros(n, dtype=torch.long, device=dev)
        key_valid = torch.cat([prompt_mask.to(dev).bool(),
                               torch.ones((n, r), dtype=torch.bool, device=dev)], dim=1)

        was_training = self.model.training
        self.model.eval()
        try:
            # prefill: [N, Lp] -> logits of the last position
            logits = self._forward(prompt_ids.to(dev), attention_mask_4d(prompt_mask.to(dev)), ctx)
            for step in range(r):
                tok, logp = sample(logits, params, generator)
                tok = torch.where(alive, tok, self.pad_id)
                tokens_out[:, step] = tok
                logp_out[:, step] = torch.where(alive, logp, 0.0)
                lengths += alive.long()
                alive &= ~torch.isin(tok, stop_ids)
                if step == r - 1 or not bool(alive.any()):
                    break
                # decode: one token per row against the cache [0, lp + step]
                mask = ~key_valid[:, None, None, : lp + step + 1]
                logits = self._forward(tok[:, None], mask, ctx)
        finally:
            self.model.train(was_training)
        response_mask = (torch.arange(r, device=dev)[None] < lengths[:, None]).long()
        return GenerationResult(prompt_ids, prompt_mask, tokens_out.cpu(), response_mask.cpu(),
                                logp_out.cpu())

    def _forward(self, tokens, mask, ctx) -> torch.Tensor:
        out = self.model(tokens, None, mask, inference_context=ctx,
                         runtime_gather_output=True)  # [N, 1, V]: gathered over TP
        ctx.sequence_len_offset += tokens.shape[1]
        return out[:, -1, :].float()
