"""Environment episodes (verl's interactions) in the engine: rows whose task names guess_number play it
against the example server in its own process; each turn the model ends is a Step, its answer is
fed into the row's KV cache as the next user turn, the Steps' rewards are the row's turn scores and
every episode is closed. Failures and timeouts end the episode with an error observation."""
import asyncio

import pytest
import test_generation_engine as base
import test_multi_turn_engine as turns
import torch

from tandem.generation.engine import GenerationEngine
from tandem.generation.episodes import Interactions
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.models.forward import forward_logits
from tandem.tools.calls import Outcome
from tandem.tools.grpc_episodes import GrpcEnvironmentCaller
from tandem.tools.tool_config import ToolRoute

model = base.model  # the tiny megatron model
PROMPTS, R = base.PROMPTS, turns.R
WORDS = {"Higher.": 20, "Lower.": 21, "Correct.": 22, "No": 24}  # "No number found in your answer."
OTHER = 23  # any other observation: an error


class Numbers:
    """A turn's text is its token ids (the stop token left out), so its last number is its last token;
    an observation is one token for its first word."""

    end_id = -1  # no tool calls here

    def __init__(self):
        self.seen: list[str] = []

    def turn_text(self, turn):
        return " ".join(map(str, turn[:-1]))

    def user_turn(self, text):
        self.seen.append(text)
        return [WORDS.get(text.split(" ")[0], OTHER)]


@pytest.fixture(scope="module")
def stops(model):
    """Each row's most frequent token: the turns end on these here, so that every row takes turns."""
    res = GenerationEngine(model, pad_id=base.PAD, eos_id=base.EOS, vocab_size=base.VOCAB).generate(
        PROMPTS, SamplingParams(max_new_tokens=R, greedy=True))
    out = set()
    for row, mask in zip(res.responses, res.response_mask.bool()):
        counts = torch.bincount(row[mask], minlength=base.VOCAB)
        counts[[base.PAD, base.EOS, OTHER, *WORDS.values()]] = 0
        out.add(int(counts.argmax()))
    return sorted(out)


def generate(model, stops, **kw):
    eng = GenerationEngine(model, pad_id=base.PAD, eos_id=stops[0], vocab_size=base.VOCAB, max_batch_size=64)
    return eng.generate(PROMPTS, SamplingParams(max_new_tokens=R, greedy=True, stop_token_ids=stops[1:]), **kw), eng


def play(model, stops, caller, tasks, timeout_s=30.0, **kw):
    fmt = Numbers()
    mt = MultiTurn(turns.Echo(), fmt, interactions=Interactions(caller, timeout_s=timeout_s), **kw)
    res, eng = generate(model, stops, tools=mt, tasks=tasks)
    return res, fmt, eng


def test_guess_number_episodes_through_the_engine(model, stops, example_server):
    plain, _ = generate(model, stops)
    ended = [torch.isin(row, torch.tensor(stops)) for row in plain.responses]
    first_stop = [int(e.nonzero()[0]) if e.any() else None for e in ended]
    right = next(i for i, s in enumerate(first_stop) if s and 1 <= int(plain.responses[i, s - 1]) <= 100)
    secret = int(plain.responses[right, first_stop[right] - 1])  # greedy: the row's first guess, right at once
    g = {"name": "guess_number"}
    tasks = [{**g, "secret": 77, "max_turns": 3}] * len(PROMPTS)  # above every token id: "Higher." each turn
    tasks[right] = {**g, "secret": secret}
    bad, unknown, none = [i for i in range(len(PROMPTS)) if i != right and first_stop[i] is not None][:3]
    tasks[bad], tasks[unknown], tasks[none] = {**g, "secret": 500}, {"name": "nope"}, None
    caller = GrpcEnvironmentCaller({"guess_number": ToolRoute(example_server)}, timeout_s=10)
    res, fmt, eng = play(model, stops, caller, tasks)

    rec, obs = res.episodes, res.observation_mask.bool()
    assert rec[none] is None and torch.equal(res.responses[none], plain.responses[none])  # no episode: one turn
    assert rec[right]["turn_scores"] == [1.0] and rec[right]["done"] and rec[right]["error"] is None
    stop = first_stop[right]
    assert torch.equal(res.responses[right, :stop + 1], plain.responses[right, :stop + 1])
    assert res.responses[right, stop + 1] == WORDS["Correct."] and int(res.response_mask[right].sum()) == stop + 2
    for i in (bad, unknown):  # StartEpisode failed: the first turn's end shows the error and ends the row
        assert rec[i]["done"] and rec[i]["turn_scores"] == [] and res.responses[i][obs[i]].tolist() == [OTHER]
    assert "StartEpisode failed: INVALID_ARGUMENT" in rec[bad]["error"] and "'secret'" in rec[bad]["error"]
    assert rec[unknown]["error"].startswith("unknown interaction 'nope'")
    higher = [i for i in range(len(PROMPTS)) if i not in (right, bad, unknown, none)]
    for i in higher:
        steps = len(rec[i]["turn_scores"])
        assert rec[i]["turn_scores"] == [0.0] * steps and set(res.responses[i][obs[i]].tolist()) <= {20, 24}
        assert rec[i]["done"] == (steps == 3) and rec[i]["error"] is None
    assert sum(len(rec[i]["turn_scores"]) for i in higher) >= 3, "the test needs rows that play on"
    out_of_turns = [t for t in fmt.seen if t.endswith(" Out of turns: it was 77.")]
    assert len(out_of_turns) == sum(rec[i]["done"] for i in higher) >= 1

    # the model's tokens are the greedy continuation of the whole sequence, observations included, and
    # only prompts, stop tokens and observations went through the model outside decode: no prefix recompute
    for i in range(len(PROMPTS)):
        n = int(res.response_mask[i].sum())
        seq = torch.cat([torch.tensor(PROMPTS[i]), res.responses[i, :n]])
        pred = forward_logits(model, seq[None], torch.ones_like(seq)[None])[0].argmax(-1)[len(PROMPTS[i]) - 1:-1]
        assert torch.equal(pred[~obs[i, :n]], res.responses[i, :n][~obs[i, :n]]), i
    assert eng.runner.fed_tokens <= sum(map(len, PROMPTS)) + 2 * int(obs.sum())

    async def step_again(instance_id):  # CloseEpisode ran: the server no longer knows any episode
        c = GrpcEnvironmentCaller({"guess_number": ToolRoute(example_server)}, timeout_s=10)
        try:
            return await c.step("guess_number", instance_id, "1")
        finally:
            await c.close_channels()

    for r in rec:
        if r is not None and r["name"] == "guess_number" and "INVALID_ARGUMENT" not in (r["error"] or ""):
            assert "Step failed: NOT_FOUND" in asyncio.run(step_again(r["instance_id"])).error


class Hangs:
    """An environment whose Steps never answer; it counts its episodes."""

    def __init__(self):
        self.started, self.closed = [], []

    async def start(self, name, instance_id, task):
        self.started.append(instance_id)
        return Outcome("go")

    async def step(self, name, instance_id, action):
        await asyncio.sleep(3600)

    async def close(self, name, instance_id):
        self.closed.append(instance_id)


class Lowers(Hangs):
    """An environment that answers every Step "Lower." with a reward of 0.5 and never ends."""

    async def step(self, name, instance_id, action):
        return Outcome("Lower.", 0.5)


def test_timeouts_and_a_dead_server_end_the_episode(model, stops):
    """A Step that hangs and a server that is not there: each episode ends at its first Step with the
    error as its observation; every started episode is closed; max_user_turns bounds the turns."""
    tasks = [{"name": "guess_number"}] * len(PROMPTS)
    hangs = Hangs()
    res, fmt, _ = play(model, stops, hangs, tasks, timeout_s=0.05)
    stepped = [r for r in res.episodes if r["turn_scores"] or r["error"]]
    assert stepped and all(r["error"] == "interaction 'guess_number' Step timed out after 0.05 s" for r in stepped)
    assert sorted(hangs.closed) == sorted(hangs.started) == sorted(r["instance_id"] for r in res.episodes)
    assert fmt.seen == ["error: " + r["error"] for r in stepped]
    assert set(res.responses[res.observation_mask.bool()].tolist()) == {OTHER}

    dead = GrpcEnvironmentCaller({"guess_number": ToolRoute("127.0.0.1:1")}, timeout_s=0.3, retry_backoff_s=0.01)
    res, _, _ = play(model, stops, dead, tasks)
    ended = [r for r in res.episodes if r["error"]]
    assert len(ended) == len(PROMPTS) and all("StartEpisode failed: UNAVAILABLE" in r["error"] for r in ended)

    res, _, _ = play(model, stops, Lowers(), tasks, max_user_turns=1)
    assert max(len(r["turn_scores"]) for r in res.episodes) == 1 and res.observation_mask.sum(-1).max() == 1
    assert all(r["turn_scores"] in ([], [0.5]) and not r["done"] for r in res.episodes)


def test_turn_scores_reach_the_reward_function(model, stops):
    """The rollout worker takes each row's interaction from extra_info.interaction_kwargs (verl's place)
    and returns turn_scores and episode columns; the Score request hands them to the reward function in
    extra_info, beside the row's own keys. Rows without interaction_kwargs carry no episode. The step's
    metrics sum the episodes' scores."""
    from tandem.config import load_config
    from tandem.controller import scoring
    from tandem.data.batch import DataProto
    from tandem.generation.engine import left_pad
    from tandem.rollout.worker import RolloutWorker

    class Decoder:  # the responses as token ids in text: what the reward request decodes with
        def batch_decode(self, rows, skip_special_tokens):
            return [" ".join(map(str, r)) for r in rows]

    worker = RolloutWorker(model, pad_id=base.PAD, eos_id=stops[0], vocab_size=base.VOCAB, max_batch_size=64,
                           tools=MultiTurn(turns.Echo(), Numbers(), interactions=Interactions(Lowers())))
    ids, mask = left_pad(PROMPTS, base.PAD)
    extra = [{"index": i, **({"interaction_kwargs": {"name": "lowers"}} if i % 2 == 0 else {})}
             for i in range(len(PROMPTS))]
    batch = DataProto(tensors={"input_ids": ids, "attention_mask": mask}, columns={
        "extra_info": extra, "ground_truth": ["0"] * len(PROMPTS), "data_source": ["x"] * len(PROMPTS)})
    gen = worker.generate_sequences(batch, SamplingParams(max_new_tokens=R, greedy=True, n=2,
                                                          stop_token_ids=stops[1:]))
    scores, episodes = gen["turn_scores"], gen["episode"]
    assert [e is None for e in episodes] == [i % 2 == 1 for i in range(len(PROMPTS)) for _ in range(2)]
    assert all(t == [0.5] * len(t) for t in scores) and sum(map(len, scores)) >= 2
    assert len({e["instance_id"] for e in episodes if e}) == len(PROMPTS)  # each sample its own episode
    request = scoring.reward_request(gen, Decoder(), load_config())
    for row, info in enumerate(request["extra_info"]):
        assert info["index"] == row // 2 and info["turn_scores"] == scores[row] and info["episode"] == episodes[row]
    from tandem.controller.step_metrics import tool_metrics

    played = [e for e in episodes if e is not None]
    m = tool_metrics(gen)  # the step's log: the episodes' summed turn scores and errors, over the rows that played
    assert m["rollout/episode_score_mean"] == sum(sum(e["turn_scores"]) for e in played) / len(played) > 0
    assert m["rollout/episode_error_ratio"] == 0 and m["num_turns/max"] >= 3
