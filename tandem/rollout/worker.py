"""RolloutWorker: generation on a megatron-core GPTModel, owned or shared.

Colocated (hybrid engine): the worker wraps the actor's own policy module, so the
rollout always sees the latest weights with no copy. Standalone: it builds its own
model, which the weight plane (tandem/weights/) refreshes in place after each actor update;
`weights_version` is then the version last synced (-1: its own initial weights).

Multi-turn (`tools`, tandem/rollout/tools.py): responses hold the tool observations too, as verl's
multi-turn rollouts do: `attention_mask` covers every real token, `response_mask` the model's own
tokens only (the loss and advantage mask), `tool_calls` [B] counts each row's calls, `tool_errors` [B] its
error observations and `num_turns` [B] its turns (verl's: the prompt, the model's and the observations). With interactions
configured, a row whose `extra_info.interaction_kwargs` names one plays an environment episode (verl's
rule) and two columns come back: `turn_scores` (each Step's reward, verl's name) and `episode` (the
row's EpisodeRecord as a dict; None for a row that played none). A row's `extra_info.tools_kwargs`
(verl's) go with its tool calls: each call carries its tool's entry to the service.
"""
from __future__ import annotations

import torch

from tandem import checkpoint
from tandem.data.batch import DataProto
from tandem.generation.engine import GenerationEngine
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.models.norm import sequence_parallel_off
from tandem.parallel import device


class RolloutWorker:
    def __init__(self, model, *, pad_id: int, eos_id: int, vocab_size: int, max_batch_size: int,
                 free_cache_engine: bool = False, weights_version: int = 0, tools: MultiTurn | None = None):
        self.model = model
        self.tools = tools
        self.free_cache_engine = free_cache_engine  # colocated: give the KV cache back to training
        self.engine = GenerationEngine(model, pad_id=pad_id, eos_id=eos_id, vocab_size=vocab_size,
                                       max_batch_size=max_batch_size)
        self.vocab_size = vocab_size
        self.weights_version = weights_version

    def generate_sequences(self, batch: DataProto, params: SamplingParams) -> DataProto:
        """Prompts (left-padded input_ids / attention_mask [B, Lp]) -> B * n rows of
        prompts, responses, response_mask, input_ids, attention_mask, rollout_log_probs,
        with the request's other tensors and columns repeated n times (prompt-major)."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        tasks = interaction_tasks(batch) if self.tools is not None and self.tools.interactions is not None else None
        kwargs = extra_info_of(batch, "tools_kwargs") if self.tools is not None else None
        with sequence_parallel_off(self.model):  # a training layout with SP generates without it
            res = self.engine.generate(prompts, params, tools=self.tools, tasks=tasks, tools_kwargs=kwargs)
        if self.free_cache_engine:  # the next call allocates (and on GPU captures) again
            self.release()
        model_tokens = res.response_mask
        if res.observation_mask is not None:  # observations are context, never trained on
            model_tokens = res.response_mask * (1 - res.observation_mask)
        out = DataProto(tensors={
            "prompts": res.prompts,
            "responses": res.responses,
            "response_mask": model_tokens,
            "input_ids": torch.cat([res.prompts, res.responses], dim=1),
            "attention_mask": torch.cat([res.prompt_mask, res.response_mask], dim=1),
            "rollout_log_probs": res.rollout_log_probs,
            **({} if res.tool_calls is None else {"tool_calls": res.tool_calls, "tool_errors": res.tool_errors,
                                                  "num_turns": res.num_turns}),
        }, meta={"temperature": params.logprob_temperature, "rollout_n": params.n,
                 "weights_version": self.weights_version})
        if res.episodes is not None:
            out.columns["turn_scores"] = [[] if e is None else e["turn_scores"] for e in res.episodes]
            out.columns["episode"] = res.episodes
        rest = batch.select(tensor_keys=[k for k in batch.tensors if k not in ("input_ids", "attention_mask")],
                            column_keys=list(batch.columns))
        if len(rest.tensors) or len(rest.columns):
            rest.meta = {}
            out = out.union(rest.repeat(params.n, interleave=True))
        return out

    def release(self) -> None:
        """Free the engine's KV cache and CUDA graphs (which point at the model's weights); the
        next generation allocates and captures again."""
        self.engine.release()
        device.empty_cache()

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> int:
        """Replace all weights at once, in place (strict: every name and shape must match); the
        colocated TP=1 copy's in-process sync (tandem/rollout/replica.py)."""
        current = checkpoint.model_weights(self.model)
        missing = sorted(set(current) - set(weights))
        unexpected = sorted(set(weights) - set(current))
        if missing or unexpected:
            raise ValueError(f"weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, t in weights.items():
            if tuple(t.shape) != tuple(current[name].shape):
                raise ValueError(f"weights: tensor {name!r} has shape {list(t.shape)}, "
                                 f"expected {list(current[name].shape)}")
            if t.dtype != current[name].dtype:
                raise ValueError(f"weights: tensor {name!r} is {t.dtype}, the model's is {current[name].dtype}")
        self.model.load_state_dict(weights, strict=False)
        self.weights_version = version
        return version


def interaction_tasks(batch: DataProto) -> list[dict | None]:
    """Each prompt's `extra_info.interaction_kwargs` (verl's place; `name` picks the interaction), or
    None. Kwargs without a name (or not a mapping) still start an episode, which fails saying so."""
    kwargs = extra_info_of(batch, "interaction_kwargs")
    return [k if k is None or isinstance(k, dict) else {"name": ""} for k in kwargs]


def extra_info_of(batch: DataProto, key: str) -> list:
    """Each prompt's `extra_info[key]`, or None where it has none (verl's tools_kwargs: the tools see it
    as it is, a malformed one fails only that row's calls)."""
    extra = batch.columns.get("extra_info") or [None] * len(batch)
    return [info.get(key) if isinstance(info, dict) else None for info in extra]
