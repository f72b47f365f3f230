"""Chat prompts show the tools of multi_turn.tool_config_path (controller/data.py), as verl's tool
agent loop renders them: `apply_chat_template(messages, tools=schemas)`, for the training and the
validation rows. A tiny character tokenizer with a chat template that renders tools, built locally."""
import json
import string

import pytest
from structlog.testing import capture_logs

from tandem.config import ConfigError, load_config
from tandem.controller.data import PromptSpec, load_examples, prompt_tools
from tandem.controller.run import Run
from tandem.tasks.arithmetic import build_tokenizer
from tandem.tokenizer import load_tokenizer

MT = "actor_rollout_ref.rollout.multi_turn"
KWARGS = {"calculator": {"create_kwargs": {"ground_truth": "408"}}}  # verl's extra_info.tools_kwargs
# Hermes-like: the tools as JSON inside <tools>, before the conversation
TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
            "{% for m in messages %}{{ m['content'] }}={% endfor %}")
CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate integers joined by + - *.",
                                         "parameters": {"type": "object", "required": ["expression"],
                                                        "properties": {"expression": {"type": "string"}}}}}
TOOLS_YAML = f"""tools:
  - class_name: tandem.calculator
    config: {{endpoint: "127.0.0.1:1", auth: {{token_file: absent.token}}}}
    tool_schema: {json.dumps(CALC)}
"""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    # every printable character is a token: the rendered schema round-trips through the ids
    chars = sorted(set(string.printable) - {"\r", "\x0b", "\x0c"})
    return build_tokenizer(str(tmp_path_factory.mktemp("tok") / "chat"), chars=chars, chat_template=TEMPLATE)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML)
    for split, content in (("train", "12*34"), ("val", "56*78")):
        rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": content}],
                 "reward_model": {"ground_truth": "0"}, "extra_info": {"tools_kwargs": KWARGS}}]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def run_of(files, tokenizer_dir, *overrides) -> Run:
    """The run's data as `tandem run` loads it (Run's constructor starts no service)."""
    cfg = load_config(overrides=[f"data.train_files={files / 'train.jsonl'}", f"data.val_files={files / 'val.jsonl'}",
                                 f"actor_rollout_ref.model.tokenizer_path={tokenizer_dir}", "data.max_prompt_length=400",
                                 "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                                 "actor_rollout_ref.model.max_position_embeddings=512", "trainer.sft.total_steps=0",
                                 *overrides])
    return Run(cfg, str(files / "run"))


def test_training_and_validation_prompts_carry_the_tool_schemas(files, tokenizer_dir):
    with capture_logs() as logs:
        run = run_of(files, tokenizer_dir, f"{MT}.enable=true", f"{MT}.tool_config_path={files / 'tools.yaml'}")
    tok = run.tokenizer
    schema = json.dumps(CALC, ensure_ascii=False)  # what the template's tojson writes
    for split, content in ((run.train, "12*34"), (run.val, "56*78")):
        (ex,) = split
        assert ex.prompt_text == f"<tools>{schema}</tools>\n{content}="
        assert tok.decode(ex.prompt_ids[1:]) == ex.prompt_text  # the ids carry it: no character lost
        assert ex.extra_info["tools_kwargs"] == KWARGS  # verl's per-row kwargs stay with the row, for its calls
    # the auth token file named by the route is not needed to render prompts
    assert not [e for e in logs if e["log_level"] == "warning"], logs


def test_without_tool_services_the_prompts_are_unchanged(files, tokenizer_dir):
    for overrides in ([], [f"{MT}.enable=true"], [f"{MT}.tool_config_path={files / 'tools.yaml'}"]):
        run = run_of(files, tokenizer_dir, *overrides)  # no YAML; the built-in calculator; multi-turn off
        assert [e.prompt_text for e in run.train + run.val] == ["12*34=", "56*78="], overrides


def test_a_tokenizer_without_chat_template_says_the_tools_are_not_shown(files, tmp_path):
    plain = build_tokenizer(str(tmp_path / "plain"), chars=list("0123456789*="))
    mt = load_config(overrides=[f"{MT}.enable=true", f"{MT}.tool_config_path={files / 'tools.yaml'}"]
                     ).actor_rollout_ref.rollout.multi_turn
    with capture_logs() as logs:
        (ex,) = load_examples(str(files / "train.jsonl"), load_tokenizer(plain),
                              spec=PromptSpec(16, tools=prompt_tools(mt)))
    assert ex.prompt_text == "12*34"
    assert [e["rows"] for e in logs if e["event"] == "data.tool_schemas_not_shown"] == [1]


def test_a_broken_tool_config_is_a_config_error_naming_the_key(files):
    (files / "tools.yaml").write_text(TOOLS_YAML.replace('"name": "calculator"', '"name": "calc ulator"'))
    mt = load_config(overrides=[f"{MT}.enable=true", f"{MT}.tool_config_path={files / 'tools.yaml'}"]
                     ).actor_rollout_ref.rollout.multi_turn
    with pytest.raises(ConfigError, match=rf"{MT}.tool_config_path: .*tools\[0\].tool_schema.function.name"):
        prompt_tools(mt)
