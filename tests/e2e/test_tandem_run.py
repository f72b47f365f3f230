"""`tandem run` end to end as a subprocess, on tiny settings: GRPO with the colocated rollout,
PPO (GAE + critic) with a standalone rollout, RLOO with KL, REINFORCE++ on a verl-style reward file.
Checks the run directory's files, the metrics, that every role ran as its own OS process, and that
none is left afterwards."""
import json
import os
import pathlib
import re
import subprocess
import sys

import psutil
import pytest

REWARD_FN = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "verl_reward_fn.py"
TINY = ["trainer.sft.total_steps=3", "trainer.sft.batch_size=8", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=200",
        "data.builtin_val_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "critic.ppo_mini_batch_size=2", "services.actor.torch_threads=1",
        # pinned so that changes of the defaults do not change what this test checks
        "data.max_prompt_length=16", "data.max_response_length=6", "trainer.test_freq=0",
        "trainer.logger=[console,jsonl,tensorboard]", "critic.init_from_policy=true",
        # SFT's dev-accuracy stop, evaluated at steps 2 and 3 and never reached: all 3 steps run
        "trainer.sft.stop_at_accuracy=0.99", "trainer.sft.eval_freq=2", "trainer.sft.dev_size=16"]
STEPS = 2
STEP_KEYS = ["actor/pg_loss", "actor/ppo_kl", "critic/score/mean", "response_length/mean", "timing_s/step",
             "training/rollout_probs_diff_max"]

CASES = {
    "grpo_colocated": (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.mode=colocated"],
                       {"actor", "reward"}),
    "ppo_standalone": (["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone"],
                       {"actor", "reward", "rollout", "critic"}),
    # KL as a loss (k3) and in the reward with the adaptive controller: exercises ref log-probs
    "rloo_kl": (["algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.use_kl_loss=true",
                 "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "algorithm.use_kl_in_reward=true",
                 "algorithm.kl_ctrl.type=adaptive", "actor_rollout_ref.rollout.free_cache_engine=true"],
                {"actor", "reward"}),
    # and the reward from a verl-style compute_score file with reward_kwargs (a length bonus: never 0)
    "reinforce_pp_entropy": (["algorithm.adv_estimator=reinforce_plus_plus",
                              "actor_rollout_ref.actor.entropy_coeff=0.01",
                              "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                              f"custom_reward_function.path={REWARD_FN}", "custom_reward_function.name=length_bonus",
                              "custom_reward_function.reward_kwargs.scale=0.5"], {"actor", "reward"}),
}


def service_pids(run_dir) -> dict[str, set[int]]:
    """{role: pids of its rank processes}, as each rank reports itself in logs/<role>.log
    (a `service.process` line per rank; short-lived helper processes a rank may fork, such as
    checkpoint writers, do not count)."""
    seen: dict[str, set[int]] = {}
    for log in (pathlib.Path(run_dir) / "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"service.process"' in line:
                event = json.loads(line)
                seen.setdefault(event["role"], set()).add(event["pid"])
    return seen


def run_tandem(overrides: list[str], timeout_s: float = 240) -> tuple[int, str, str, dict[str, set[int]]]:
    """Run `python -m tandem.controller run ...`; -> exit code, stdout, stderr and the pids of the
    service processes it started (from the run directory's logs)."""
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *overrides],
                          capture_output=True, text=True, timeout=timeout_s)
    found = re.search(r"tandem: (?:run directory|resuming) (\S+)", proc.stdout)
    return proc.returncode, proc.stdout, proc.stderr, service_pids(found.group(1)) if found else {}


@pytest.mark.parametrize("case", list(CASES))
def test_tandem_run(case, tmp_path):
    overrides, roles = CASES[case]
    rc, out, err, pids = run_tandem([*TINY, *overrides, f"trainer.default_local_dir={tmp_path}",
                                     f"trainer.experiment_name={case}"])
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    (run_name,) = os.listdir(tmp_path)
    run_dir = tmp_path / run_name
    assert run_name.startswith(case) and str(run_dir) in out

    # summary
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("val_accuracy_after_sft", "val_accuracy_final", "rl_gain"):
        assert isinstance(summary[key], float), key
        assert -1.0 <= summary[key] <= 1.0
    assert summary["rl_gain"] == pytest.approx(summary["val_accuracy_final"] - summary["val_accuracy_after_sft"])
    estimator = next(o.split("=", 1)[1] for o in overrides if o.startswith("algorithm.adv_estimator="))
    assert summary["adv_estimator"] == estimator and summary["val_size"] == 16
    assert summary["sft_steps"] == 3 and [step for step, _ in summary["sft_dev_accuracy"]] == [2, 3]
    assert all(0.0 <= acc <= 1.0 for _, acc in summary["sft_dev_accuracy"])
    out_lines = out.splitlines()
    start = out_lines.index("{")
    printed = json.loads("\n".join(out_lines[start: out_lines.index("}", start) + 1]))
    assert printed["val_accuracy_final"] == summary["val_accuracy_final"]

    # metrics: one line per RL step with the step keys (plus val/accuracy lines)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_lines = [m for m in lines if "actor/pg_loss" in m]
    assert [m["step"] for m in step_lines] == list(range(1, STEPS + 1))
    keys = STEP_KEYS + (["critic/vf_loss"] if "ppo" in case else [])
    if case == "rloo_kl":
        keys += ["actor/kl_loss", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"]
    if "standalone" in case:  # the weight plane's metrics (controller/weight_sync.py)
        keys += ["timing_s/weight_sync", "weight_sync/bytes", "perf/weight_sync_gbps", "rollout/weights_version"]
        # versions: 3 SFT steps, then one update per RL step
        assert [m["rollout/weights_version"] for m in step_lines] == [3 + s for s in range(1, STEPS + 1)]
        assert all(m["weight_sync/bytes"] > 0 for m in step_lines)
    for m in step_lines:
        for k in keys:
            assert isinstance(m.get(k), (int, float)), f"step {m['step']}: {k} missing"
        assert 1 <= m["response_length/mean"] <= 6 and m["timing_s/step"] > 0
        if "custom_reward_function.name=length_bonus" in overrides:  # exact match + 0.5 x length / 10
            assert 0.0 < m["critic/score/mean"] <= 1.3 and m["reward/failed_rows"] == 0
        else:
            assert 0.0 <= m["critic/score/mean"] <= 1.0
    if "ppo" not in case:
        assert all("critic/vf_loss" not in m for m in lines)
    assert any(m["step"] == 0 and "val/accuracy" in m for m in lines)

    # tensorboard, plot, checkpoints, logs
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    png = run_dir / "curves.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpt = run_dir / "checkpoints" / f"global_step_{STEPS}"
    assert (ckpt / "actor" / "tandem_complete").is_file()
    assert (ckpt / "critic" / "tandem_complete").is_file() == ("ppo" in case)
    assert json.loads((ckpt / "controller_state.json").read_text())["global_step"] == STEPS
    for role in roles:
        log = (run_dir / "logs" / f"{role}.log").read_text()
        assert '"event": "server.serving"' in log and f'"role": "{role}"' in log, role
    assert {p.stem for p in (run_dir / "logs").glob("*.log")} == roles
    assert not list((run_dir / "logs").glob("*.port"))  # removed by each service at stop

    # every role was its own OS process, and none outlived the run
    assert set(pids) == roles, f"saw service processes {pids}"
    all_pids = [p for ps in pids.values() for p in ps]
    assert all(len(ps) == 1 for ps in pids.values()) and len(set(all_pids)) == len(roles)
    alive = [p for p in all_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"service processes still alive after the run: {alive}"
