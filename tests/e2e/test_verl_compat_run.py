"""`tandem run` as a verl user runs it: from a tiny Qwen3 (dense) checkpoint with the wandb (offline)
and mlflow (local file store) sinks, each read back with the library's own reader; and from the
overrides of verl's Megatron GRPO example (tests/data/verl_run_qwen2-7b_math_megatron.txt) with local
paths and the CPU-size changes listed in CPU_CHANGES."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from test_tandem_run import TINY
from tiny_hf import tiny_qwen2, tiny_qwen3
from wandb_log import offline_run

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "verl_run_qwen2-7b_math_megatron.txt"
# verl's timing_s/* names a standalone-rollout GRPO step logs (controller/step.py)
STEP_TIMINGS = ["gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights", "step"]
# What the example needs besides paths to run on 2 CPU cores, and why (with only paths changed it loads:
# tests/e2e/test_verl_script_dry_run.py). Its layout stays: TP=2 x PP=2, Hugging Face weights imported per
# pipeline stage, generation on a TP=1 copy on every rank.
CPU_CHANGES = [
    "trainer.n_gpus_per_node=4",  # 4 ranks (TP=2 x PP=2): 8 processes do not fit 2 cores
    "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 1024 x 5 rows: hours on CPU
    "data.max_response_length=16",  # a random model rarely stops: 1024 tokens per row
    "trainer.total_epochs=1", "data.train_max_samples=8", "data.val_max_samples=8",  # 2 steps
    "trainer.val_before_train=False",  # verl's key: no validation before RL (one validation less on CPU)
    "services.startup_timeout_s=900",  # megatron ranks importing on a shared, loaded 2-core machine
]


def run(args: list[str], env: dict | None = None, timeout: float = 480) -> tuple[pathlib.Path, str]:
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return pathlib.Path(re.search(r"tandem: run directory (\S+)", proc.stdout).group(1)), proc.stderr


def metrics_of(run_dir: pathlib.Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    return {m["step"]: m for m in lines if "actor/pg_loss" in m}


def with_tokenizer(model: pathlib.Path, tokenizer_dir: str) -> str:
    for name in os.listdir(tokenizer_dir):
        shutil.copy(os.path.join(tokenizer_dir, name), model / name)
    return str(model)


def test_qwen3_run_logs_to_wandb_offline_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow >= 3.10 opens a file store only when asked
    from tandem.tasks.arithmetic import build_tokenizer

    model = with_tokenizer(tiny_qwen3(tmp_path / "qwen3"), build_tokenizer(str(tmp_path / "tok")))
    run_dir, err = run([*TINY, f"trainer.default_local_dir={tmp_path}", "trainer.experiment_name=qwen3",
                        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.mode=standalone",
                        "trainer.logger=[console,jsonl,wandb,mlflow]", "trainer.log_val_generations=2"],
                       env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    steps = metrics_of(run_dir)
    assert sorted(steps) == [1, 2]
    for m in steps.values():
        assert all(m[f"timing_s/{t}"] > 0 for t in STEP_TIMINGS), sorted(m)
        assert m["perf/time_per_step"] == m["timing_s/step"] and m["perf/throughput"] > 0
        assert m["training/rollout_probs_diff_max"] < 1e-4  # the synced rollout is the actor's Qwen3
    # wandb's transaction log: every step's metrics, the config
    wb = offline_run(str(run_dir))
    logged = {h["_step"]: h for h in wb["history"] if "actor/pg_loss" in h}
    assert sorted(logged) == [1, 2] and logged[2]["actor/pg_loss"] == pytest.approx(steps[2]["actor/pg_loss"])
    assert wb["config"]["actor_rollout_ref"]["model"]["path"] == model
    tables = [h["val/generations/nrows"] for h in wb["history"] if "val/generations/nrows" in h]
    assert tables == [2, 2]  # the validation samples table, before and after RL
    # mlflow's file store, through its client
    client = mlflow.MlflowClient("file:" + str(run_dir / "mlruns"))
    (ml_run,) = client.search_runs([client.get_experiment_by_name("tandem").experiment_id])
    history = client.get_metric_history(ml_run.info.run_id, "actor/pg_loss")
    assert [(h.step, h.value) for h in history] == [(s, pytest.approx(steps[s]["actor/pg_loss"])) for s in (1, 2)]
    assert ml_run.data.params["actor_rollout_ref.rollout.mode"] == "standalone" and ml_run.info.status == "FINISHED"
    assert client.list_artifacts(ml_run.info.run_id, "val_generations")
    samples = [json.loads(x) for x in open(run_dir / "val_generations.jsonl")]
    assert len(samples) == 4 and {s["step"] for s in samples} == {0, 2} and all("output" in s for s in samples)
    # the ETA after step 1 counts RL steps only (not start-up or validation)
    eta = re.search(r"step 1/2 .*ETA (\d+):(\d\d):(\d\d)", err)
    assert eta and int(eta[1]) * 3600 + int(eta[2]) * 60 + int(eta[3]) <= steps[1]["timing_s/step"] + 1, err[-2000:]


def example_overrides(home: pathlib.Path, model: str) -> list[str]:
    lines = [x.strip() for x in EXAMPLE.read_text().splitlines() if x.strip() and not x.startswith("#")]
    return [x.replace("{HOME}", str(home)).replace("{MODEL}", model) for x in lines]


def verl_example_files(tmp_path) -> tuple[pathlib.Path, str]:
    """$HOME/data/{gsm8k,math}/{train,test}.parquet in verl's schema and a tiny Qwen2 with a chat tokenizer."""
    from tandem.tasks.gsm8k_format import write_gsm8k_format

    home = tmp_path / "home"
    for name in ("gsm8k", "math"):
        paths = write_gsm8k_format(str(tmp_path / name), train_size=8, val_size=8)
        (home / "data" / name).mkdir(parents=True)
        shutil.copy(paths["train"], home / "data" / name / "train.parquet")
        shutil.copy(paths["val"], home / "data" / name / "test.parquet")
    model = with_tokenizer(tiny_qwen2(tmp_path / "qwen2", max_position_embeddings=2048), paths["tokenizer"])
    return home, model


def test_verl_example_runs_with_paths_and_cpu_sizes(tmp_path):
    pytest.importorskip("wandb")
    home, model = verl_example_files(tmp_path)
    run_dir, err = run([*example_overrides(home, model), *CPU_CHANGES, f"trainer.default_local_dir={tmp_path}"],
                       env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"}, timeout=1500)
    assert "verl key actor_rollout_ref.rollout.name='vllm' -> " in err  # each mapped key gets a notice
    assert not (run_dir / "metrics.jsonl").exists()  # the example logs to the console and wandb only
    steps = {h["_step"]: h for h in offline_run(str(run_dir))["history"] if "actor/pg_loss" in h}
    assert sorted(steps) == [1, 2]  # total_epochs=1: 8 rows / 4 per batch
    assert all(m["actor/kl_loss"] >= 0 and m["response_length/mean"] > 0 for m in steps.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "step 2/2" in err and summary["val_accuracy_final"] is not None
    # no warm start on the user's data (trainer.sft.total_steps auto), no validation before RL
    assert summary.get("sft_steps") is None and summary.get("val_accuracy_after_sft") is None
    assert summary.get("val_accuracy_init") is None
