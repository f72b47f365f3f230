"""controller/data.py (jsonl + chat template, overlong prompts dropped with a logged count,
deterministic cursor that resumes exactly) and controller/dapo.py (concatenating
generation rounds, the dynamic-sampling loop and its bound)."""
import asyncio
import json

import pytest
import torch
from structlog.testing import capture_logs

from tandem.config import load_config
from tandem.controller.dapo import collect_varied_groups
from tandem.controller.data import Cursor, collate, load_examples
from tandem.data.batch import DataProto
from tandem.rollout.outputs import concat_generations
from tandem.tasks.arithmetic import build_tokenizer

TEMPLATE = "{% for m in messages %}{{ m['content'] }}={% endfor %}"


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = build_tokenizer(str(tmp_path_factory.mktemp("tok") / "chat"), chat_template=TEMPLATE)
    return AutoTokenizer.from_pretrained(path)


def write_jsonl(path, prompts):
    with open(path, "w") as f:
        for i, (content, answer) in enumerate(prompts):
            f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": content}],
                                "reward_model": {"ground_truth": answer}, "extra_info": {"index": i}}) + "\n")


def test_jsonl_chat_template_and_overlong_count(tmp_path, chat_tokenizer):
    path = tmp_path / "d.jsonl"
    write_jsonl(path, [("1+2", "3"), ("12+34", "46"), ("5+5", "10"), ("100+200", "300")])
    with capture_logs() as logs:
        # bos + "1+2=" is 5 tokens: kept; bos + "12+34=" is 7: dropped
        ex = load_examples(str(path), chat_tokenizer, max_prompt_length=5)
    assert [e.prompt_text for e in ex] == ["1+2=", "5+5="]  # the template added "="
    assert ex[0].prompt_ids == [chat_tokenizer.bos_token_id] + chat_tokenizer("1+2=")["input_ids"]
    assert (ex[0].data_source, ex[0].ground_truth, ex[0].extra_info) == ("openai/gsm8k", "3", {"index": 0})
    (warn,) = [entry for entry in logs if entry["event"] == "data.overlong_prompts_dropped"]
    assert warn["dropped"] == 2 and warn["max_prompt_length"] == 5


def test_all_prompts_overlong_is_an_error(tmp_path, chat_tokenizer):
    path = tmp_path / "d.jsonl"
    write_jsonl(path, [("123+456", "579")])
    with pytest.raises(ValueError, match="dropped 1 overlong"):
        load_examples(str(path), chat_tokenizer, max_prompt_length=4)


def test_cursor_is_deterministic_and_resumes_exactly():
    a, b = Cursor(10, seed=3), Cursor(10, seed=3)
    first = a.next(4) + a.next(4)
    assert first == b.next(8) and sorted(a.next(2) + first) == list(range(10))  # one epoch, a permutation
    assert Cursor(10, seed=4).next(8) != first
    assert Cursor(10, seed=3, shuffle=False).next(12) == list(range(10)) + [0, 1]
    state = json.loads(json.dumps(a.state_dict()))  # what controller_state.json holds
    resumed = Cursor(10, seed=3)
    resumed.load_state_dict(state)
    assert resumed.next(15) == a.next(15)  # crosses into the next epochs identically


def gen_rows(prompt_width: int, rows: int, scores: list[float]) -> DataProto:
    prompts = torch.arange(rows * prompt_width).view(rows, prompt_width) + 10
    responses = torch.ones(rows, 3, dtype=torch.long)
    return DataProto(tensors={
        "prompts": prompts, "responses": responses, "response_mask": torch.ones(rows, 3, dtype=torch.long),
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.ones(rows, prompt_width + 3, dtype=torch.long),
        "acc": torch.tensor(scores), "seq_reward": torch.tensor(scores)},
        columns={"ground_truth": [str(s) for s in scores]})


def test_concat_generations_left_pads_prompt_side():
    out = concat_generations([gen_rows(2, 2, [0, 1]), gen_rows(4, 2, [1, 1])], pad_id=0)
    assert out["input_ids"].shape == (4, 7) and out["prompts"].shape == (4, 4)
    assert out["attention_mask"][:2].tolist() == [[0, 0, 1, 1, 1, 1, 1]] * 2
    assert out["input_ids"][0].tolist() == [0, 0, 10, 11, 1, 1, 1]
    assert out["ground_truth"] == ["0", "1", "1", "1"]


def dapo_cfg(**kw):
    over = ["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    return load_config(None, over + [f"{k}={v}" for k, v in kw.items()])


def scripted(rounds_scores):
    """A generate(prompts, round) that returns scripted scores (the loop's logic, no model)."""
    async def generate(prompts, i):
        return gen_rows(3, len(rounds_scores[i]), rounds_scores[i])
    return generate


def test_dynamic_sampling_fills_the_batch_and_counts_drops():
    # n = 2, want 2 groups. round 0: groups [1,1] drop, [0,1] keep; round 1: [0,0] drop, [1,0] keep, [0,1] surplus
    rounds = [[1, 1, 0, 1], [0, 0, 1, 0, 0, 1]]
    out, m = asyncio.run(collect_varied_groups(scripted(rounds), lambda k: None, dapo_cfg(), pad_id=0))
    assert out["acc"].tolist() == [0, 1, 1, 0]  # exactly train_batch_size groups
    assert m == {"train/num_gen_batches": 2.0, "train/num_dropped_groups": 2.0, "train/num_kept_groups": 2.0,
                 "reward/failed_rows": 0.0}


def test_dynamic_sampling_bound():
    rounds = [[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0]]
    cfg = dapo_cfg(**{"algorithm.filter_groups.max_num_gen_batches": 2})
    out, m = asyncio.run(collect_varied_groups(scripted(rounds), lambda k: None, cfg, pad_id=0))
    assert len(out) == 2 and m["train/num_gen_batches"] == 2 and m["train/num_kept_groups"] == 1
    with pytest.raises(RuntimeError, match="algorithm.filter_groups"):
        asyncio.run(collect_varied_groups(scripted([[1, 1], [0, 0]]), lambda k: None, cfg, pad_id=0))


def test_collate_left_pads():
    from tandem.controller.data import Example

    b = collate([Example([1, 5], "a", "1", "s", {}), Example([1, 6, 7], "b", "2", "s", {})], pad_id=0)
    assert b["input_ids"].tolist() == [[0, 1, 5], [1, 6, 7]] and b["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]


def test_dynamic_sampling_counts_rows_the_reward_dropped():
    """Rows dropped for a failed reward (meta reward_failed_rows, reward_model.on_failure=drop) are
    summed over the rounds; a round left with no rows is skipped."""
    async def generate(prompts, i):
        if i == 0:
            empty = gen_rows(3, 0, [])
            empty.meta["reward_failed_rows"] = 4
            return empty
        rows = gen_rows(3, 4, [0, 1, 1, 0])
        rows.meta["reward_failed_rows"] = 2
        return rows
    out, m = asyncio.run(collect_varied_groups(generate, lambda k: None, dapo_cfg(), pad_id=0))
    assert out["acc"].tolist() == [0, 1, 1, 0]
    assert m["reward/failed_rows"] == 6.0 and m["train/num_gen_batches"] == 2.0
