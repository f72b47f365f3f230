"""Multi-turn generation: rows stop on a tool call, get the observation appended into the same KV
cache and decode on. The tokens equal a from-scratch recompute of the whole sequence; failures and
timeouts become observations; a slow tool holds only its own row."""
import asyncio
import time

import pytest
import test_generation_engine as base
import torch

from tandem.generation.engine import GenerationEngine
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.models.forward import forward_logits
from tandem.tools.calls import ToolCall, ToolResult

VOCAB, PAD, EOS, PROMPTS, ROW_LOG_PROB_TOL = base.VOCAB, base.PAD, base.EOS, base.PROMPTS, base.ROW_LOG_PROB_TOL
model = base.model  # the same tiny megatron model fixture
OK_TOKENS, ERR_TOKEN = [20, 21, 22], 23
R = 24


@pytest.fixture(scope="module")
def end_id(model):
    """A token the model writes often mid-response: it plays the tool call's closing token."""
    res = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB).generate(
        PROMPTS, SamplingParams(max_new_tokens=R, greedy=True))
    body = res.responses[:, :R // 2][res.response_mask[:, :R // 2].bool()]
    counts = torch.bincount(body, minlength=VOCAB)
    counts[[EOS, PAD, ERR_TOKEN, *OK_TOKENS]] = 0
    return int(counts.argmax())


class Format:
    """Each turn is one call; the observation is OK_TOKENS, or ERR_TOKEN for a failed call."""

    def __init__(self, end_id):
        self.end_id = end_id
        self.seen: list[ToolResult] = []

    def parse(self, turn):
        return [ToolCall("echo", {"turn": turn})]

    def observation(self, results):
        self.seen += results
        return [t for r in results for t in (OK_TOKENS if r.ok else [ERR_TOKEN])]


class Echo:
    async def call(self, calls):
        return [ToolResult("ok", True) for _ in calls]


class InPairs:
    """Answers calls two at a time (a lone call after 2 s), so answers come back together."""

    def __init__(self):
        self.waiting: list[asyncio.Future] = []

    async def call(self, calls):
        done = asyncio.get_running_loop().create_future()
        self.waiting.append(done)
        if len(self.waiting) >= 2:
            for f in self.waiting:
                f.set_result(None)
            self.waiting = []
        try:
            await asyncio.wait_for(asyncio.shield(done), 2)
        except asyncio.TimeoutError:
            self.waiting.remove(done)
        return [ToolResult("ok", True) for _ in calls]


class Raises:
    def __init__(self):
        self.attempts = 0

    async def call(self, calls):
        self.attempts += 1
        raise RuntimeError("tool service down")


class Hangs:
    async def call(self, calls):
        await asyncio.sleep(3600)


class SlowFirst:
    """Holds the first call until no other row is decoding (or 60 s: then says so)."""

    def __init__(self, engine):
        self.engine, self.first = engine, True

    async def call(self, calls):
        if self.first:
            self.first = False
            deadline = time.monotonic() + 60
            while bool(self.engine.runner.alive.any()):
                if time.monotonic() > deadline:
                    return [ToolResult("stalled", False) for _ in calls]
                await asyncio.sleep(0.005)
        return [ToolResult("ok", True) for _ in calls]


def generate(model, caller, end_id, engine=None, **kw):
    engine = engine or GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=64)
    fmt = Format(end_id)
    mt = MultiTurn(caller, fmt, **{"max_assistant_turns": 3, **kw})
    res = engine.generate(PROMPTS, SamplingParams(max_new_tokens=R, greedy=True), tools=mt)
    return res, fmt, engine


def test_observations_continue_on_the_cached_prefix(model, end_id):
    """Greedy multi-turn rows, answered two at a time: every model token is the argmax of a from-scratch
    forward of the whole sequence (observations included) and its log-prob matches; only the prompts
    went through the model outside decode: the decode fed each stop token and observation on top of
    the cached prefix (no prefix recompute, no forward of its own)."""
    res, fmt, engine = generate(model, InPairs(), end_id)
    obs = res.observation_mask.bool()
    assert res.tool_calls.sum() >= 3 and obs.any(), "the test needs rows that call the tool"
    assert all(r.ok for r in fmt.seen)
    assert (res.rollout_log_probs[obs] == 0).all()
    width = res.prompts.shape[1]
    for i in range(len(PROMPTS)):
        n = int(res.response_mask[i].sum())
        seq = torch.cat([res.prompts[i][res.prompt_mask[i].bool()], res.responses[i, :n]])
        logits = forward_logits(model, seq[None], torch.ones_like(seq)[None])[0].float()
        start = len(PROMPTS[i])
        for j in range(n):
            if obs[i, j]:
                assert res.responses[i, j] in OK_TOKENS
                continue
            pred = logits[start + j - 1]
            assert int(pred.argmax()) == int(res.responses[i, j]), (i, j)
            lp = torch.log_softmax(pred, -1)[res.responses[i, j]]
            assert abs(float(lp) - float(res.rollout_log_probs[i, j])) < ROW_LOG_PROB_TOL
        assert width >= start
    assert engine.runner.fed_tokens == sum(len(p) for p in PROMPTS)


def test_the_turn_limit_holds(model, end_id):
    res, _, _ = generate(model, Echo(), end_id, max_assistant_turns=2)
    assert res.tool_calls.max() <= 1
    single, _, _ = generate(model, Echo(), end_id, max_assistant_turns=1)
    assert single.tool_calls.sum() == 0 and not single.observation_mask.any()


def test_failures_and_timeouts_become_observations(model, end_id):
    raises = Raises()
    res, fmt, _ = generate(model, raises, end_id, retries=2)
    calls = int(res.tool_calls.sum())
    assert calls >= 3 and raises.attempts == 3 * calls
    assert all(not r.ok and "RuntimeError: tool service down (3 attempts)" in r.text for r in fmt.seen)
    assert set(res.responses[res.observation_mask.bool()].tolist()) == {ERR_TOKEN}

    res, fmt, _ = generate(model, Hangs(), end_id, timeout_s=0.05, retries=0)
    assert len(fmt.seen) == int(res.tool_calls.sum()) >= 3
    assert all(not r.ok and "timed out after 0.05 s" in r.text for r in fmt.seen)
    assert set(res.responses[res.observation_mask.bool()].tolist()) == {ERR_TOKEN}


def test_a_slow_tool_holds_only_its_row(model, end_id):
    """The first call is answered only once no other row decodes: the others went on meanwhile,
    and every row is the one an instant tool gives."""
    fast, _, _ = generate(model, Echo(), end_id)
    engine = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=64)
    slow, fmt, _ = generate(model, SlowFirst(engine), end_id, engine=engine)
    assert all(r.ok for r in fmt.seen), "the slow call stalled the other rows"
    assert torch.equal(slow.responses, fast.responses)
    assert torch.equal(slow.observation_mask, fast.observation_mask)


class CalculatorCalls(Format):
    """Calls of the example server's calculator, alternating: a product it answers, one it cannot parse."""

    def __init__(self, end_id):
        super().__init__(end_id)
        self.sent: list[str] = []

    def parse(self, turn):
        self.sent.append("123456789*987654321" if len(self.sent) % 2 == 0 else "2*")
        return [ToolCall("calculator", {"expression": self.sent[-1]})]


def test_tool_services_named_by_a_verl_tool_config_answer(model, end_id, tmp_path, example_server):
    """multi_turn.tool_config_path: the engine's calls go over gRPC to the example calculator in its own
    process, at the endpoint verl's tool-config YAML names; its answers and its errors come back."""
    from tool_server import CALCULATOR

    from tandem.config import load_config
    from tandem.rollout.tools import tool_caller_from_config

    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(CALCULATOR.format(endpoint=example_server))
    mt_cfg = load_config(overrides=["actor_rollout_ref.rollout.multi_turn.enable=true",
                                    f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools_yaml}"]
                         ).actor_rollout_ref.rollout.multi_turn
    engine = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=64)
    fmt = CalculatorCalls(end_id)
    mt = MultiTurn(tool_caller_from_config(mt_cfg), fmt, max_assistant_turns=3)
    res = engine.generate(PROMPTS, SamplingParams(max_new_tokens=R, greedy=True), tools=mt)
    assert int(res.tool_calls.sum()) == len(fmt.seen) == len(fmt.sent) >= 2
    answers = {"123456789*987654321": ToolResult("121932631112635269", True),
               "2*": ToolResult("calculator: expected a number, got the end in '2*'", False)}
    assert sorted(fmt.seen, key=str) == sorted((answers[e] for e in fmt.sent), key=str), (fmt.sent, fmt.seen)


CORRECT, WRONG, NO_TRUTH = 20, 21, 22  # observation tokens: what verl's gsm8k tool said (else ERR_TOKEN)


class AnswerCalls(Format):
    """Every turn submits the answer 72 to verl's gsm8k tool; the observation is one token saying what
    came back, so each row's tokens show which kwargs its calls carried."""

    def parse(self, turn):
        return [ToolCall("calc_gsm8k_reward", {"answer": "72"})]

    def observation(self, results):
        self.seen += results
        return [(CORRECT if r.text.endswith("correct, score 1.0") else WRONG) if r.ok
                else NO_TRUTH if "no ground truth" in r.text else ERR_TOKEN for r in results]


def test_each_rows_tools_kwargs_go_with_its_calls(model, end_id, tmp_path, example_server):
    """verl's extra_info.tools_kwargs through the rollout worker: each row's calls of verl's gsm8k tool
    (the example server's, configured by verl's YAML) carry that row's entry, its ground truth, and
    only its; a row without one sends none; malformed kwargs are that row's error observation, refused
    by the caller or by the server, and the other rows go on."""
    from tool_server import GSM8K

    from tandem.data.batch import DataProto
    from tandem.generation.engine import left_pad
    from tandem.rollout.worker import RolloutWorker
    from tandem.tools.grpc_caller import GrpcToolCaller
    from tandem.tools.tool_config import load_tool_config

    (tmp_path / "gsm8k.yaml").write_text(GSM8K.format(endpoint=example_server))
    fmt = AnswerCalls(end_id)
    caller = GrpcToolCaller.from_tool_config(load_tool_config(str(tmp_path / "gsm8k.yaml")))
    worker = RolloutWorker(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=64,
                           tools=MultiTurn(caller, fmt, max_assistant_turns=3))

    def truth(value):
        return {"create_kwargs": {"ground_truth": value}}

    extra = [{"tools_kwargs": {"calc_gsm8k_reward": truth("72")}}, {"tools_kwargs": {"calc_gsm8k_reward": truth(71)}},
             {"index": 2},  # no tools_kwargs: nothing sent, the tool says it has no ground truth
             {"tools_kwargs": {"calc_gsm8k_reward": ["72"]}},  # not an object: the caller refuses it
             {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": "72"}}},  # the server refuses it
             {"tools_kwargs": {"another_tool": truth("72")}}]  # another tool's entry is not sent
    expected = [CORRECT, WRONG, NO_TRUTH, ERR_TOKEN, ERR_TOKEN, NO_TRUTH]
    ids, mask = left_pad(PROMPTS, PAD)
    out = worker.generate_sequences(DataProto(tensors={"input_ids": ids, "attention_mask": mask},
                                              columns={"extra_info": extra}),
                                    SamplingParams(max_new_tokens=R, n=2, seed=3))
    obs = (out["attention_mask"][:, out["prompts"].shape[1]:] - out["response_mask"]).bool()
    said = [set(out["responses"][row][obs[row]].tolist()) for row in range(len(out))]
    for row, tokens in enumerate(said):
        assert tokens <= {expected[row // 2]}, (row, tokens)  # rows are prompt-major: n=2 samples each
    assert {expected[row // 2] for row, tokens in enumerate(said) if tokens} == set(expected)  # every kind called
    errors = [r.text for r in fmt.seen if not r.ok and "no ground truth" not in r.text]
    assert "error: tool 'calc_gsm8k_reward': the row's tools_kwargs for it must be a JSON object, got list" in errors
    assert "error: tool 'calc_gsm8k_reward' failed: INVALID_ARGUMENT: instance_kwargs_json: create_kwargs must be a " \
           "JSON object, got str" in errors
