"""verl's multi-turn keys: honoured or mapped, the SGLang-only ones refused by name; the rollout's
MultiTurn built from them; the Hermes (<tool_call> JSON) and the built-in calculator formats."""
import asyncio
import json

import pytest

from tandem.config import ConfigError, load_config
from tandem.rollout.hermes_format import HermesFormat
from tandem.rollout.tools import multi_turn_from_config
from tandem.tasks.arithmetic import CHARS, build_tokenizer
from tandem.tasks.calculator_tool import TOOL_CHARS, CalculatorCaller, CalculatorFormat
from tandem.tools.calls import ToolCall, ToolResult

MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tokenizer(str(tmp_path_factory.mktemp("tok") / "t"), CHARS + TOOL_CHARS))


def test_verl_keys_are_taken_and_sglang_ones_refused_by_name():
    cfg = load_config(overrides=[f"{MT}.enable=true", f"{MT}.max_assistant_turns=3", "data.tool_config_path=null",
                                 f"{MT}.tokenization_sanity_check_mode=strict"])  # verl's defaults: accepted
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable and cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3
    for key in ("use_inference_chat_template=true", "num_repeat_rollouts=2", "tokenization_sanity_check_mode=disable"):
        with pytest.raises(ConfigError, match=f"{MT}.{key.split('=')[0]}.*SGLang"):
            load_config(overrides=[f"{MT}.{key}"])
    with pytest.raises(ConfigError, match=f"data.tool_config_path.*{MT}.tool_config_path"):
        load_config(overrides=["data.tool_config_path=tools.yaml"])
    with pytest.raises(ConfigError, match=f"{MT}.format"):
        load_config(overrides=[f"{MT}.format=xml"])


def chat_tokenizer(path):
    """A character tokenizer with the Hermes format's special tokens (a Qwen2.5-style chat model's)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tokenizer(str(path), list(
        "abcdefghijklmnopqrstuvwxyz0123456789{}[]\":,_ +\n<>/|.")))
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>", "<|im_end|>",
                                                          "<|im_start|>"]})
    return tok


def test_interactions_come_from_verl_keys_and_their_yaml(tool_tokenizer, tmp_path):
    """multi_turn.interaction_config_path and max_user_turns are taken; the YAML's entries become
    EnvironmentService routes by name (verl's name from the class when none is given); a bad file is an
    error naming the file and the field; the calculator format cannot write an environment's turns."""
    good = tmp_path / "interactions.yaml"
    good.write_text("interaction:\n  - name: guess_number\n    class_name: x.GuessNumberInteraction\n"
                    "    config: {endpoint: '127.0.0.1:50090', timeout_s: 5, max_guesses: 3}\n"
                    "  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                    "    config: {endpoint: 'h:1'}\n")
    keys = [f"{MT}.enable=true", f"{MT}.interaction_config_path={good}", f"{MT}.max_user_turns=2",
            f"{MT}.format=hermes"]
    mt = multi_turn_from_config(load_config(overrides=keys).actor_rollout_ref.rollout, chat_tokenizer(tmp_path / "t"))
    routes = mt.interactions.caller.routes
    assert sorted(routes) == ["gsm8k", "guess_number"] and routes["guess_number"].endpoint == "127.0.0.1:50090"
    assert routes["guess_number"].timeout_s == 5 and mt.interactions.timeout_s == 2 * 30 and mt.max_user_turns == 2
    from tandem.tools.interaction_config import load_interaction_config

    assert "not used (settings of verl's interaction class): interaction[0].config.max_guesses" in \
        load_interaction_config(str(good)).notices[0]
    for text, problem in [("interaction:\n  - name: g\n    config: {}\n",
                           r"interaction\[0\]\.config\.endpoint: missing: the HOST:PORT of the EnvironmentService"),
                          ("interaction:\n  - {name: g, config: {endpoint: nohost}}\n",
                           r"interaction\[0\]\.config\.endpoint: 'nohost' is not HOST:PORT"),
                          ("interaction:\n  - {name: g, config: {endpoint: 'h:1'}}\n  - {name: g, config: {}}\n",
                           r"interaction\[1\]\.name: 'g' is named by an earlier interaction"),
                          ("interactions: []\n", "interaction: must be a non-empty list")]:
        (tmp_path / "bad.yaml").write_text(text)
        bad = [f"{MT}.enable=true", f"{MT}.interaction_config_path={tmp_path / 'bad.yaml'}"]
        with pytest.raises(ConfigError, match=f"{MT}.interaction_config_path: {tmp_path / 'bad.yaml'}: {problem}"):
            multi_turn_from_config(load_config(overrides=bad).actor_rollout_ref.rollout, tool_tokenizer)
    with pytest.raises(ConfigError, match=f"{MT}.interaction_config_path: the CalculatorFormat .*format=hermes"):
        multi_turn_from_config(load_config(overrides=keys[:2]).actor_rollout_ref.rollout, tool_tokenizer)
    with pytest.raises(ConfigError, match=f"{MT}.max_user_turns"):
        load_config(overrides=[f"{MT}.max_user_turns=-1"])


def test_the_rollout_builds_the_calculator_turns(tool_tokenizer):
    cfg = load_config(overrides=[f"{MT}.enable=true", f"{MT}.max_assistant_turns=2"]).actor_rollout_ref.rollout
    mt = multi_turn_from_config(cfg, tool_tokenizer)
    assert isinstance(mt.format, CalculatorFormat) and isinstance(mt.caller, CalculatorCaller)
    assert mt.max_assistant_turns == 2
    off = load_config().actor_rollout_ref.rollout
    assert multi_turn_from_config(off, tool_tokenizer) is None
    with pytest.raises(ConfigError, match=f"{MT}.tool_config_path"):  # no such file
        multi_turn_from_config(load_config(overrides=[f"{MT}.enable=true", f"{MT}.tool_config_path=t.yaml"])
                               .actor_rollout_ref.rollout, tool_tokenizer)


def test_tool_services_keep_their_own_deadline(tool_tokenizer, tmp_path):
    """A tool config's timeout_s (120 s) is not cut by multi_turn.tool_timeout_s (30 s), and the gRPC
    caller's retries are not repeated around it."""
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - class_name: slow\n    config: {endpoint: '127.0.0.1:1', timeout_s: 120}\n"
        "    tool_schema: {type: function, function: {name: slow, parameters: {type: object, properties: {}}}}\n")
    cfg = load_config(overrides=[f"{MT}.enable=true", f"{MT}.tool_config_path={tmp_path / 'tools.yaml'}"])
    mt = multi_turn_from_config(cfg.actor_rollout_ref.rollout, tool_tokenizer)
    assert mt.caller.routes["slow"].timeout_s == 120 and mt.caller.max_retries == 1
    assert (mt.timeout_s, mt.retries) == (240, 0)


def test_calculator_format_and_caller(tool_tokenizer):
    fmt = CalculatorFormat(tool_tokenizer)
    turn = tool_tokenizer("1[123456+987654]", add_special_tokens=False)["input_ids"]
    assert turn[-1] == fmt.end_id
    calls = fmt.parse(turn)
    assert calls == [ToolCall("calculator", {"expression": "123456+987654"})]
    more = [ToolCall("calculator", {"expression": "1+x"}), ToolCall("calculator", {"expression": "012*345"})]
    results = asyncio.run(CalculatorCaller().call(calls + more))
    assert results[0] == ToolResult("1111110", True) and not results[1].ok and results[2] == ToolResult("004140", True)
    assert tool_tokenizer.decode(fmt.observation(results[:1])) == "{1111110}"
    assert tool_tokenizer.decode(fmt.observation(results[1:2])) == "{!}"
    assert fmt.parse(tool_tokenizer("12]", add_special_tokens=False)["input_ids"]) == []


def test_hermes_needs_the_tool_call_tokens(tool_tokenizer):
    with pytest.raises(ValueError, match="<tool_call>"):
        HermesFormat(tool_tokenizer)


def test_hermes_format_with_a_chat_tokenizer(tmp_path):
    tok = chat_tokenizer(tmp_path / "t")
    fmt = HermesFormat(tok, max_parallel_calls=2)
    body = json.dumps({"name": "calculator", "arguments": {"expression": "1+2"}})
    turn = tok(f"ok <tool_call>\n{body}\n</tool_call><tool_call>\nnot json\n</tool_call>",
               add_special_tokens=False)["input_ids"]
    assert fmt.parse(turn[:turn.index(fmt.end_id) + 1]) == [ToolCall("calculator", {"expression": "1+2"})]
    text = tok.decode(fmt.observation([ToolResult("3", True)]))
    assert text == "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # an environment's turn follows the model's own end of turn (this tokenizer's EOS is not <|im_end|>)
    assert fmt.turn_text(tok("ok 42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) == "ok 42"
    assert tok.decode(fmt.user_turn("lower.")) == \
        "<|im_end|>\n<|im_start|>user\nlower.<|im_end|>\n<|im_start|>assistant\n"


def test_the_tool_task_data_and_reward(tool_tokenizer):
    from tandem.services.reward.rules.arithmetic import score_final_answer
    from tandem.tasks.arithmetic import make_problems
    from tandem.tasks.calculator_tool import DATA_SOURCE, DIGITS, OP, tool_task_rows

    problems = make_problems(400, seed=1, fixed_width=True, digits=DIGITS, op=OP)
    (a, b), answer = problems[0][0].rstrip("=").split(OP), problems[0][1]
    assert len(a) == len(b) == DIGITS and int(answer) == int(a) * int(b) and len(answer) == 2 * DIGITS
    rows = tool_task_rows(problems, "train")
    demos = [r["extra_info"]["answer"] for r in rows if "answer" in r["extra_info"]]
    assert 0.15 < len(demos) / len(rows) < 0.35 and all(r["data_source"] == DATA_SOURCE for r in rows)
    fmt = CalculatorFormat(tool_tokenizer)
    prompt, answer = next((r["prompt"][0]["content"], r["reward_model"]["ground_truth"]) for r in rows
                          if "answer" in r["extra_info"])
    demo = next(r["extra_info"]["answer"] for r in rows if "answer" in r["extra_info"])
    call = demo[:demo.index("]") + 1]
    assert fmt.parse(tool_tokenizer(call, add_special_tokens=False)["input_ids"]) == [
        ToolCall("calculator", {"expression": prompt.rstrip("=")})]
    assert demo.endswith("}" + answer)
    assert not any("answer" in r["extra_info"] for r in tool_task_rows(problems, "val"))
    assert score_final_answer(["[1+2]{03}03", "03", "[1+2]{03}04", "[1+2]{03}"], ["03"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_the_tool_config_loads_with_and_without_the_tool():
    cfg = load_config("deploy/configs/arithmetic_tool.yaml")
    assert cfg.data.builtin_task == "mul_tool" and cfg.actor_rollout_ref.rollout.multi_turn.enable
    off = load_config("deploy/configs/arithmetic_tool.yaml", [f"{MT}.enable=false"])
    assert not off.actor_rollout_ref.rollout.multi_turn.enable and off.trainer.sft == cfg.trainer.sft
