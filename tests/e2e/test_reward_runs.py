"""Whole `tandem run`s with the rewards users bring, and with every port locked:

- a tiny Hugging Face LlamaForSequenceClassification as the reward model (reward service on
  megatron-core) scores and trains;
- a verl-style compute_score file (tests/helpers/verl_reward_fn.py; one that trains: test_tandem_run.py's
  reinforce_pp_entropy case) that raises or exceeds its timeout drops those rows' groups
  (on_failure=drop) or fails the run (fail), and the log names it;
- an external reward server that fails single rows: the dropped rows never score 0;
- TLS and bearer tokens on all four roles (PPO, standalone rollout).
"""
import json
import math
import os
import pathlib
import sys

from certs import make_certs, tls_overrides
from server_process import ROOT, server_process
from test_tandem_run import TINY, run_tandem
from tiny_hf import tiny_reward_model

FN_FILE = ROOT / "tests" / "helpers" / "verl_reward_fn.py"


def _run(tmp_path, name, overrides, expect_rc=0, timeout_s=300):
    rc, out, err, pids = run_tandem([*TINY, f"trainer.default_local_dir={tmp_path / 'runs'}",
                                     f"trainer.experiment_name={name}", *overrides], timeout_s=timeout_s)
    assert rc == expect_rc, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    runs = list((tmp_path / "runs").iterdir())
    run_dir = runs[0] if runs else None
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if run_dir and (run_dir / "metrics.jsonl").exists() else []
    return run_dir, metrics, out, err, pids


def _steps(metrics):
    return [m for m in metrics if "actor/pg_loss" in m]


def test_reward_model_run_scores_and_trains(tmp_path):
    rm = tiny_reward_model(tmp_path / "rm", "llama")
    run_dir, metrics, _, _, pids = _run(tmp_path, "rm", [
        "reward_model.enable=true", f"reward_model.model.path={rm}", "reward_model.micro_batch_size_per_gpu=3"])
    steps = _steps(metrics)
    assert [m["step"] for m in steps] == [1, 2]
    scores = [m["critic/score/mean"] for m in steps]
    assert all(math.isfinite(s) for s in scores)
    assert not all(s in (0.0, 1.0) for s in scores)  # a model's scores, not a verifier's 0/1
    assert all(m["reward/failed_rows"] == 0 for m in steps)
    assert set(pids) == {"actor", "reward"}
    log = (run_dir / "logs" / "reward.log").read_text()
    assert '"world_size": 1' in log and '"event": "server.serving"' in log


def test_a_raising_or_hanging_function_drops_its_rows_by_config(tmp_path):
    run_dir, metrics, out, err, _ = _run(tmp_path, "flaky_drop", [
        f"custom_reward_function.path={FN_FILE}", "custom_reward_function.name=flaky_score",
        "custom_reward_function.timeout_s=1", "reward_model.on_failure=drop"])
    steps = [m for m in metrics if "reward/failed_rows" in m]
    assert steps and sum(m["reward/failed_rows"] for m in steps) > 0
    for m in steps:  # every scored row got 1.0: a failed row scored 0 would pull the mean down
        if "critic/score/mean" in m:
            assert m["critic/score/mean"] == 1.0, m
    assert any("actor/pg_loss" in m for m in steps)  # it trained on what was scored
    val = [m for m in metrics if "val/accuracy" in m]
    assert val and all(m["val/accuracy"] == 1.0 and m["val/failed_rows"] > 0 for m in val)
    reward_log = (run_dir / "logs" / "reward.log").read_text()
    assert "flaky_score raised ZeroDivisionError: cannot score" in reward_log
    assert "flaky_score exceeded custom_reward_function.timeout_s=1 (killed)" in reward_log
    # the controller names the behaviour
    assert '"event": "reward.rows_failed"' in err and '"on_failure": "drop"' in err


def test_a_raising_function_fails_the_run_by_default(tmp_path):
    _, _, _, err, _ = _run(tmp_path, "flaky_fail", [
        f"custom_reward_function.path={FN_FILE}", "custom_reward_function.name=flaky_score",
        "custom_reward_function.timeout_s=1", "trainer.sft.total_steps=0"], expect_rc=1)
    assert "tandem: run failed: reward:" in err and "reward_model.on_failure=fail" in err
    assert "flaky_score raised ZeroDivisionError: cannot score" in err or "exceeded custom_reward_function" in err


def test_failed_rows_of_an_external_reward_never_score_zero(tmp_path):
    cmd = [sys.executable, str(ROOT / "tests" / "helpers" / "faulty_reward_server.py"),
           "--port-file", str(tmp_path / "port"), "--fault", "rows"]
    with server_process(cmd, tmp_path / "port") as endpoint:
        _, metrics, _, err, pids = _run(tmp_path, "faulty_external", [
            f"services.reward.endpoint={endpoint}", "reward_model.on_failure=drop"])
    steps = [m for m in metrics if "reward/failed_rows" in m]
    assert [m["step"] for m in steps] == [1, 2] and set(pids) == {"actor"}
    assert sum(m["reward/failed_rows"] for m in steps) > 0, steps
    for m in steps:
        if "critic/score/mean" in m:
            assert m["critic/score/mean"] == 1.0, m
    assert '"event": "reward.rows_failed"' in err and '"on_failure": "drop"' in err


def test_a_whole_run_with_tls_and_tokens_on_every_port(tmp_path):
    certs = make_certs(tmp_path / "certs")
    overrides = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone"]
    for role in ("actor", "rollout", "critic", "reward"):
        (tmp_path / f"{role}.token").write_text(f"token-of-{role}-{os.urandom(6).hex()}")
        overrides += tls_overrides(role, certs, mutual=role == "critic")
        overrides.append(f"services.{role}.auth.token_file={tmp_path / f'{role}.token'}")
    run_dir, metrics, _, _, pids = _run(tmp_path, "locked", overrides)
    assert [m["step"] for m in _steps(metrics)] == [1, 2]
    assert set(pids) == {"actor", "rollout", "critic", "reward"}
    for role in pids:
        log = (run_dir / "logs" / f"{role}.log").read_text()
        assert '"tls": true' in log and '"token": true' in log, role
        assert pathlib.Path(tmp_path / f"{role}.token").read_text() not in log
