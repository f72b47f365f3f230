"""`tandem run` with tools end to end: the example tool server (services/tools/examples/server.py) as
its own process, a verl tool-config YAML naming it (multi_turn.tool_config_path), and a short GRPO run
whose rollout calls it between turns.

The task is the built-in tool task's format (`[12*34]` pauses the row, the rollout appends the
answer in braces, tandem/tasks/calculator_tool.py): its call is the server's `calculator` tool with
`{"expression": "12*34"}`. The server answers products without the built-in task's zero padding, and
the built-in warm start shows a call in only some rows (a short warm start seldom calls), so the data
is written here: every training row demonstrates the call with the server's answer, the ground truth
unpadded as the server writes it."""
import json
import re

import pytest
from test_tandem_run import run_tandem
from tool_server import calculator_tool_config  # tests/helpers

from tandem.tasks.arithmetic import CHARS, build_tokenizer, to_rows, write_dataset
from tandem.tasks.calculator_tool import DATA_SOURCE, TOOL_CHARS

MT = "actor_rollout_ref.rollout.multi_turn"
STEPS, ROWS = 2, 8  # RL steps; rows per step (train_batch_size x n)
RUN = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.mode=colocated", f"{MT}.enable=true",
       f"trainer.total_training_steps={STEPS}", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
       "actor_rollout_ref.actor.ppo_mini_batch_size=2", "services.actor.torch_threads=1",
       "data.max_prompt_length=16", "data.max_response_length=16", "actor_rollout_ref.model.max_position_embeddings=32",
       "trainer.test_freq=0", "trainer.logger=[jsonl]", "trainer.log_val_generations=16",
       # the warm start teaches the call (cheap: the run's time is its processes starting)
       "trainer.sft.total_steps=60", "trainer.sft.batch_size=16", "trainer.sft.stop_at_accuracy=null"]


def tool_rows(problems, split):
    rows = to_rows(problems, split)
    for row, (prompt, answer) in zip(rows, problems):
        row["data_source"] = DATA_SOURCE  # reward: exact match of what follows the last observation
        if split == "train":
            row["extra_info"]["answer"] = f"[{prompt.rstrip('=')}]{{{answer}}}{answer}"
    return rows


def test_a_run_calls_the_tool_server(tmp_path):
    train, val = write_dataset(str(tmp_path / "data"), 200, 16, seed=0, rows=tool_rows, op="*")
    tokenizer = build_tokenizer(str(tmp_path / "tokenizer"), CHARS + TOOL_CHARS)
    with calculator_tool_config(tmp_path, log_file=tmp_path / "tools.log") as tools_yaml:
        rc, out, err, _ = run_tandem([*RUN, f"{MT}.tool_config_path={tools_yaml}",
                                      f"data.train_files={train}", f"data.val_files={val}",
                                      f"actor_rollout_ref.model.tokenizer_path={tokenizer}",
                                      f"trainer.default_local_dir={tmp_path / 'runs'}"])
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    (run_dir,) = (tmp_path / "runs").iterdir()

    # the server's own log: one `rpc` line per call it answered
    rpcs = [json.loads(line) for line in (tmp_path / "tools.log").read_text().splitlines() if line.startswith("{")]
    served = [r for r in rpcs if r.get("event") == "rpc" and r["method"] == "ToolService.CallTool"]
    assert served and all(r["code"] == "OK" for r in served), rpcs[-5:]

    steps = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "actor/pg_loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for m in steps:
        calls, observed = m["rollout/tool_calls_mean"], m["rollout/observation_tokens_mean"]
        assert calls > 0 and observed > 3 * calls, m  # longer than the failure mark `{!}`: answers came back
        # the batch's tokens are the prompts and the responses, observations included in the responses'
        # lengths as verl counts them (no loss on them: tests/unit/test_multi_turn_training.py)
        assert m["perf/total_num_tokens"] == pytest.approx(ROWS * (m["prompt_length/mean"] + m["response_length/mean"]))
        assert m["response_length/mean"] > observed

    # the validation rows read the server's exact products (beyond this model), each call one the server logged
    outputs = [json.loads(line)["output"] for line in (run_dir / "val_generations.jsonl").read_text().splitlines()]
    answered = [m.groups() for o in outputs for m in re.finditer(r"\[(\d+)\*(\d+)\]\{(\d+)\}", o)]
    assert answered and all(int(a) * int(b) == int(v) for a, b, v in answered), outputs
    assert len(served) >= len(answered)
