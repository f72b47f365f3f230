"""Batched generation on a megatron-core GPTModel: the scheduler/runner loop.

`GenerationEngine.generate` is three calls in a loop: the scheduler (CPU) plans which
prompts to admit into free cache slots and how many decode steps to run, the runner
executes the plan on the device and reports which slots are still alive, and the
scheduler frees finished slots for the waiting prompts (continuous batching). The n
samples of a prompt share one prefill. On a GPU (TP = 1) each decode step is a CUDA
graph replay and the host looks at the finished flags only every `sync_every` steps;
on CPU (and with TP > 1) the same step runs eagerly, every step.

Results do not depend on the batching: a row's random draws are a function of
(seed, row, position) (see sampling.sample_rows), so any slot count gives the same rows.

Multi-turn (`tools=MultiTurn(...)`): a row that stops on a tool call keeps its slot and KV cache
while its call runs (multi_turn.py); its observation is fed into the same cache and it decodes on.
Observation tokens are part of the response, flagged in `observation_mask`. With `tasks` (a prompt's
interaction_kwargs) and `MultiTurn.interactions`, each of its rows plays an environment episode whose
turns come back the same way (episodes.py); `episodes` records them. With `tools_kwargs` (a prompt's
verl extra_info.tools_kwargs), its rows' calls of a tool carry that tool's entry.

Not here: pipeline parallelism, vLLM/SGLang engines, prefix caching across prompts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.generation import interrupt
from tandem.generation.multi_turn import MultiTurn, ToolLoop, ToolTurns
from tandem.generation.runner import ModelRunner, Request
from tandem.generation.sampling import SamplingParams
from tandem.generation.scheduler import Scheduler
from tandem.parallel import device


@dataclass
class GenerationResult:
    prompts: torch.Tensor  # [N, Lp] left-padded with pad_id
    prompt_mask: torch.Tensor  # [N, Lp] 1 = real token
    responses: torch.Tensor  # [N, R] right-padded with pad_id, R = max_new_tokens
    response_mask: torch.Tensor  # [N, R] 1 up to and including the stop token
    rollout_log_probs: torch.Tensor  # [N, R] fp32, 0 on padding
    observation_mask: torch.Tensor | None = None  # [N, R] 1 = a tool's observation token (multi-turn)
    tool_calls: torch.Tensor | None = None  # [N] tool calls each row made (multi-turn)
    tool_errors: torch.Tensor | None = None  # [N] its error observations (failed calls, calls that did not parse)
    num_turns: torch.Tensor | None = None  # [N] its turns, the prompt's included (verl's num_turns)
    episodes: list[dict | None] | None = None  # [N] each row's environment episode (episodes.EpisodeRecord)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def _pow2_buckets(limit: int, smallest: int = 8) -> list[int]:
    out, b = [], smallest
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


class GenerationEngine:
    """Generation with a static KV cache of `max_batch_size` slots (rows decoded together).

    use_graphs: capture decode in CUDA graphs (default: on when CUDA is present; TP > 1
    always runs eagerly). sync_every: decode steps between host looks at the finished
    flags (default 8 on GPU, 1 on CPU). kv_bucket: attention spans the cache rounded up
    to a multiple of this many positions (bounds the number of graphs; default 128 with
    graphs, else 16: eager CPU decode then attends over the positions it needs, and a multiple
    of the 16-float vector width leaves SDPA's sums, hence every output bit, as at 128). decode_attention:
    "triton" (decode_attention.py's split-K kernel; the default with CUDA, SDPA where it
    cannot run), "sdpa" (torch's fused kernels) or "matmul" (two batched GEMMs, fp32 softmax).
    fused_decode: decode on the layers' weights through fused_step.py (default: on with
    CUDA; TP > 1 and models it does not cover use the modules). compile_decode:
    torch.compile those functions (default: on with CUDA; compiled once per batch size,
    seconds each, on the first call that uses it; a fused_step.MODES name picks what is
    compiled and how, True is fused_step.DEFAULT_MODE). shared_prefix: with the Triton kernel and
    n > 1, each prompt's n samples read its KV once per decode step (prefix_groups.py)."""

    def __init__(self, model, *, pad_id: int, eos_id: int, vocab_size: int,
                 max_batch_size: int = 512, use_graphs: bool | None = None,
                 sync_every: int | None = None, kv_bucket: int | None = None,
                 decode_attention: str | None = None, fused_decode: bool | None = None,
                 compile_decode: bool | str | None = None, shared_prefix: bool = True):
        self.model = model
        self.pad_id, self.eos_id, self.vocab_size = pad_id, eos_id, vocab_size
        self.max_batch_size = max_batch_size
        gpu = device.has_cuda()
        self.use_graphs = gpu if use_graphs is None else use_graphs
        self.sync_every = sync_every or (8 if gpu else 1)
        self.kv_bucket = kv_bucket or (128 if self.use_graphs else 16)
        self.decode_attention = decode_attention or ("triton" if gpu else "sdpa")
        self.fused_decode = gpu if fused_decode is None else fused_decode
        self.compile_decode = gpu if compile_decode is None else compile_decode
        self.shared_prefix = shared_prefix
        self.runner: ModelRunner | None = None
        self._tool_loop: ToolLoop | None = None

    def release(self) -> None:
        """Free the KV cache and graphs (e.g. before the colocated actor trains)."""
        self.runner = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 tools: MultiTurn | None = None, tasks: list[dict | None] | None = None,
                 tools_kwargs: list | None = None) -> GenerationResult:
        """Each prompt is sampled params.n times; rows are prompt-major (p0 s0, p0 s1, ...).
        With `tools`, rows call tools between turns; max_new_tokens bounds a row's whole response,
        observations included. `tasks[p]`: prompt p's interaction_kwargs (None: no episode); each of
        its rows plays its own episode (tools.interactions). `tools_kwargs[p]`: prompt p's verl
        tools_kwargs ({tool name: {"create_kwargs": ...}}; None: none), sent with its rows' calls."""
        params.validate(self.vocab_size)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        n, r = params.n, params.max_new_tokens
        rows = len(prompts) * n
        slots = max(n, min(self.max_batch_size, rows))
        need = max(len(p) for p in prompts) + r
        max_len = -(-need // self.kv_bucket) * self.kv_bucket
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31, ()).item())
        stop_ids = sorted({self.eos_id, *params.stop_token_ids, *([tools.format.end_id] if tools else [])})

        if self.runner is None:
            self.runner = ModelRunner(self.model, device=device.device(), use_graphs=self.use_graphs,
                                      window=self.sync_every,
                                      decode_attention=self.decode_attention, fused=self.fused_decode,
                                      compile=self.compile_decode, shared_prefix=self.shared_prefix)
        runner = self.runner
        runner.begin(Request(prompts, params, stop_ids, seed), slots, max_len)
        sched = Scheduler([len(p) for p in prompts], n, r, num_slots=slots,
                          max_len=runner.cache.max_len, sync_every=self.sync_every,
                          batch_buckets=_pow2_buckets(slots), kv_bucket=self.kv_bucket)
        interruptible = getattr(getattr(self.model, "config", None), "tensor_model_parallel_size", 1) == 1
        turns, lockstep = None, not interruptible  # TP > 1: the group's ranks must plan alike
        if tools is not None:
            self._tool_loop = self._tool_loop or ToolLoop()
            row_tasks = None if tasks is None else [t for t in tasks for _ in range(n)]
            row_kwargs = None if tools_kwargs is None else [k for k in tools_kwargs for _ in range(n)]
            turns = ToolTurns(tools, self._tool_loop, rows, r, lockstep=lockstep, tasks=row_tasks,
                              tools_kwargs=row_kwargs)
        was_training = self.model.training
        self.model.eval()
        try:
            while True:
                if turns is not None:  # answered rows continue; wait only when nothing can decode
                    turns.resume(runner, sched, block=sched.stalled)
                    if sched.stalled:
                        if interruptible:
                            interrupt.check()
                        continue
                if (plan := sched.schedule()) is None:
                    break
                if interruptible:
                    interrupt.check()  # the run is being cancelled: cut the generation here
                alive = runner.execute(plan)
                paused = turns.pause(runner, sched, alive) if turns is not None else frozenset()
                sched.update(plan, alive, paused)
        finally:
            self.model.train(was_training)
            if turns is not None:
                turns.cancel()
                turns.close()  # CloseEpisode runs however the generation ended
        tokens, logp, mask = runner.outputs()
        tokens = torch.where(mask, tokens, self.pad_id)
        prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(n)], self.pad_id)
        out = GenerationResult(prompt_ids, prompt_mask, tokens.cpu(), mask.long().cpu(),
                               torch.where(mask, logp, 0.0).cpu())
        if turns is not None:
            out.observation_mask = runner.observation_mask().long().cpu()
            out.rollout_log_probs = torch.where(out.observation_mask.bool(), 0.0, out.rollout_log_probs)
            out.tool_calls = torch.tensor(turns.calls, dtype=torch.long)
            out.tool_errors = torch.tensor(turns.errors, dtype=torch.long)
            out.num_turns = torch.tensor([1 + a + u for a, u in zip(turns.turns, turns.user_turns)], dtype=torch.long)
            if tools.interactions is not None:
                records = turns.episodes.records if turns.episodes is not None else [None] * rows
                out.episodes = [None if e is None else e.as_dict() for e in records]
        return out
