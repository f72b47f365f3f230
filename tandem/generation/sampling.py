"""Sampling parameters and token sampling: temperature, top-k, top-p, explicit seeds.

Returned log-probs are log softmax(logits / T) of the chosen token, before top-k/top-p
filtering: the same quantity the actor recomputes (tandem.models.logprobs), which is
what PPO's importance ratio needs. Greedy decoding reports T = 1 log-probs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    n: int = 1
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    greedy: bool = False

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError naming the bad field."""
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0 (or set greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"sampling.stop_token_ids {bad} out of vocabulary [0, {vocab_size})")

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self.greedy else self.temperature


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside top-k / the top-p nucleus to -inf. [N, V] -> [N, V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, V] full-vocab logits -> (tokens [N] int64, log-probs [N] fp32). No host sync."""
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(-1)
    else:
        z = filter_logits(logits / params.temperature, params.top_k, params.top_p)
        probs = z.softmax(-1)
        # Exponential race (Gumbel-max): argmax p / E, E ~ Exp(1), is a draw from p.
        noise = torch.empty_like(probs).exponential_(1, generator=generator)
        tokens = (probs / noise).argmax(-1)
    logp = torch.log_softmax(logits / params.logprob_temperature, -1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
