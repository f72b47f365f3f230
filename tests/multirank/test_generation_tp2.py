"""The generation engine at TP=2 over gloo (2 processes): greedy equals full recompute,
both ranks produce the same rows, and the rows equal the TP=1 engine's on the same weights; also
multi-turn rows whose tool answers each rank at its own pace and in its own words: only the first rank
calls it and the others take its answers, so the ranks plan alike and keep the same rows; a slow call
holds only its own row; environment episodes likewise (only the first rank plays, every rank records).

This file is also the rank script: `python tests/multirank/test_generation_tp2.py RANK tcp://HOST:PORT OUT_DIR`.
"""
import os
import sys
from pathlib import Path

import torch

VOCAB, PAD, EOS = 32, 0, 1
PROMPTS = [[5, 9, 3, 17, 22, 8, 4], [7, 2], [30, 12, 6, 6], [3], [11, 25, 19, 2, 14, 27]]


def build(tp):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       init_std=0.3)
    return build_gpt_model(shape, tp=tp).eval()


class RankPacedTool:
    """Answers after a delay that differs by rank and call, and with the rank's own text: only the group's
    first rank may call it (the others take its answers), or the ranks' rows would part."""

    def __init__(self, rank):
        self.rank, self.calls = rank, 0

    async def call(self, calls):
        import asyncio

        from tandem.tools.calls import ToolResult

        self.calls += 1
        await asyncio.sleep(0.02 * ((self.calls + self.rank) % 3))
        return [ToolResult(f"rank{self.rank}", True) for _ in calls]


class SlowFirst(RankPacedTool):
    """Holds its first call until no other row is decoding (or 30 s: then says so): at TP > 1 the rows
    still decode while one row waits on a slow tool."""

    def __init__(self, rank, engine):
        super().__init__(rank)
        self.engine, self.stalled = engine, False

    async def call(self, calls):
        import asyncio
        import time

        if self.calls == 0:
            deadline = time.monotonic() + 30
            while bool(self.engine.runner.alive.any()):
                if time.monotonic() > deadline:
                    self.stalled = True
                    break
                await asyncio.sleep(0.005)
        return await super().call(calls)


class OneTokenAnswers:
    end_id = 3  # a token this model writes often

    def parse(self, turn):
        from tandem.tools.calls import ToolCall

        return [ToolCall("t", {})]

    def observation(self, results):
        return [20, 21] if results[0].text == "rank0" else [22]


class RankEnv:
    """An environment (EnvironmentCaller) that answers each rank in its own words at its own pace: only the
    group's first rank may play it. A Step's reward and end follow from the turn, so runs compare."""

    def __init__(self, rank):
        self.rank, self.calls = rank, 0

    async def start(self, name, instance_id, task):
        from tandem.tools.calls import Outcome

        self.calls += 1
        return Outcome("")

    async def step(self, name, instance_id, action):
        import asyncio

        from tandem.tools.calls import Outcome

        self.calls += 1
        await asyncio.sleep(0.02 * ((self.calls + self.rank) % 3))
        words = action.split()
        return Outcome(f"rank{self.rank}", reward=float(len(words)), done=len(words) >= 4)

    async def close(self, name, instance_id):
        return None


class EnvTurns:
    """The turns' text and the environment's answers in token ids (no tool calls)."""
    end_id = -1

    def turn_text(self, turn):
        return " ".join(map(str, turn))

    def user_turn(self, text):
        return [20, 21] if text == "rank0" else [22]


def generate(model, rank=0):
    from tandem.generation.engine import GenerationEngine
    from tandem.generation.multi_turn import MultiTurn
    from tandem.generation.sampling import SamplingParams

    e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=4)
    greedy = e.generate(PROMPTS, SamplingParams(max_new_tokens=8, greedy=True))
    sampled = e.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.8, top_k=6, n=2, seed=4))
    tool = RankPacedTool(rank)
    multi = e.generate(PROMPTS, SamplingParams(max_new_tokens=12, greedy=True),
                       tools=MultiTurn(tool, OneTokenAnswers(), max_assistant_turns=3))
    assert multi.tool_calls.sum() >= 2, "the test needs rows that call the tool"
    assert (tool.calls > 0) == (rank == 0), f"rank {rank} made {tool.calls} tool calls"
    slow_tool = SlowFirst(rank, e)
    slow = e.generate(PROMPTS, SamplingParams(max_new_tokens=12, greedy=True),
                      tools=MultiTurn(slow_tool, OneTokenAnswers(), max_assistant_turns=3))
    assert not slow_tool.stalled, "a slow tool held the other rows at TP > 1"
    assert torch.equal(slow.responses, multi.responses) and torch.equal(slow.observation_mask, multi.observation_mask)
    from tandem.generation.episodes import Interactions

    env = RankEnv(rank)
    played = e.generate(PROMPTS, SamplingParams(max_new_tokens=12, greedy=True, stop_token_ids=[3]),
                        tools=MultiTurn(tool, EnvTurns(), max_assistant_turns=3, interactions=Interactions(env)),
                        tasks=[{"name": "e"}] * len(PROMPTS))
    scores = [sum(ep["turn_scores"]) for ep in played.episodes]
    assert sum(len(ep["turn_scores"]) for ep in played.episodes) >= 2 and played.observation_mask.any(), \
        "the test needs rows that step"
    assert (env.calls > 0) == (rank == 0), f"rank {rank} made {env.calls} environment calls"
    return {"played": played.responses, "played_observed": played.observation_mask,
            "turn_scores": torch.tensor(scores), "greedy": greedy.responses, "greedy_mask": greedy.response_mask,
            "greedy_lp": greedy.rollout_log_probs, "sampled": sampled.responses,
            "sampled_lp": sampled.rollout_log_probs, "multi": multi.responses,
            "multi_observed": multi.observation_mask}


def main() -> int:
    rank, init_method, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from tandem.models.forward import forward_logits
    from tandem.models.logprobs import gather_vocab
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(tp=2), rank, 2, init_method, seed=1)
    model = build(tp=2)
    out = generate(model, rank)
    with torch.no_grad():  # greedy vs full recompute, at TP=2
        for i, p in enumerate(PROMPTS):
            seq = list(p)
            for t in range(int(out["greedy_mask"][i].sum())):
                ids = torch.tensor([seq])
                logits = gather_vocab(forward_logits(model, ids, torch.ones_like(ids)))[0, -1].float()
                assert int(out["greedy"][i, t]) == int(logits.argmax()), f"rank {rank} row {i} token {t}"
                seq.append(int(logits.argmax()))
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    print(f"rank {rank}: greedy equals recompute at tp=2", flush=True)
    return 0


def test_generation_tp2_matches_recompute_and_tp1(megatron_dist, tmp_path, run_ranks):
    from tandem.parallel.layout import local_tcp_rendezvous

    cmd = [sys.executable, str(Path(__file__).resolve())]
    rendezvous = local_tcp_rendezvous()
    run_ranks([cmd + [str(r), rendezvous, str(tmp_path)] for r in range(2)], timeout=240)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for key in r0:
        assert torch.equal(r0[key], r1[key]), f"ranks disagree on {key}"
    tp1 = generate(build(tp=1))
    assert torch.equal(tp1["greedy"], r0["greedy"]) and torch.equal(tp1["sampled"], r0["sampled"])
    assert torch.equal(tp1["multi"], r0["multi"]) and torch.equal(tp1["multi_observed"], r0["multi_observed"])
    for key in ("played", "played_observed", "turn_scores"):  # environment episodes at TP=2 as at TP=1
        assert torch.equal(tp1[key], r0[key]), key
    torch.testing.assert_close(tp1["sampled_lp"], r0["sampled_lp"], atol=1e-5, rtol=0)


if __name__ == "__main__":
    sys.exit(main())
