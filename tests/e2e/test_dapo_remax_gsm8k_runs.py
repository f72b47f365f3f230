"""`tandem run` end to end (real service processes) for issue 4's features:

* a GSM8K-format parquet written by `python -m tandem.tasks.gsm8k_format` (chat template,
  `#### answer` verifier chosen by data_source openai/gsm8k), validated every step with
  n=2 sampled responses: verl's val-core / val-aux names per data_source;
* ReMax (greedy baseline rollout) with DAPO dynamic sampling, overlong shaping and
  truncated IS on the built-in task: the dropped-group count is logged and the data
  cursor in controller_state.json accounts for every generated prompt.
"""
import json
import subprocess
import sys

SMALL = ["trainer.sft.batch_size=8", "trainer.total_training_steps=2", "data.train_batch_size=4",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "services.actor.torch_threads=1", "trainer.logger=[jsonl]"]


def tandem_run(args, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *SMALL, *args,
                           f"trainer.default_local_dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, lines


def test_gsm8k_format_parquet_with_validation(tmp_path):
    data = tmp_path / "gsm8k"
    subprocess.run([sys.executable, "-m", "tandem.tasks.gsm8k_format", str(data), "--train-size", "300",
                    "--val-size", "16"], check=True, timeout=120)
    runs = tmp_path / "runs"
    runs.mkdir()
    run_dir, lines = tandem_run([
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
        f"actor_rollout_ref.model.tokenizer_path={data / 'tokenizer'}", "data.max_response_length=10",
        "trainer.sft.total_steps=3", "trainer.sft.stop_at_accuracy=null", "trainer.test_freq=1",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    ], runs)
    val = [m for m in lines if "val/accuracy" in m]
    assert [m["step"] for m in val] == [0, 1, 2]  # after SFT, every step (test_freq=1), final
    for m in val:
        for key in ("val-core/openai/gsm8k/reward/mean@2", "val-core/openai/gsm8k/reward/best@2/mean",
                    "val-core/openai/gsm8k/reward/maj@2/mean", "val-aux/openai/gsm8k/reward/std@2",
                    "val-aux/openai/gsm8k/reward/worst@2/mean", "val-aux/openai/gsm8k/reward_greedy/mean@1"):
            assert 0.0 <= m[key] <= 1.0, key
        assert m["val-core/openai/gsm8k/reward/best@2/mean"] >= m["val-aux/openai/gsm8k/reward/worst@2/mean"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["val_size"] == 16 and "val-core/openai/gsm8k/reward/mean@2" in summary["val_metrics_final"]
    assert sum(1 for m in lines if "actor/pg_loss" in m) == 2


def test_remax_dapo_tis_builtin(tmp_path):
    run_dir, lines = tandem_run([
        "trainer.sft.total_steps=3", "trainer.sft.stop_at_accuracy=null", "data.builtin_train_size=200",
        "data.builtin_val_size=8",
        "trainer.test_freq=0", "algorithm.adv_estimator=remax", "algorithm.filter_groups.enable=true",
        # an untrained model is never right (acc all 0): filter on the shaped reward, which varies with length
        "algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.max_num_gen_batches=20",
        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=3",
        "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
    ], tmp_path)
    steps = [m for m in lines if "actor/pg_loss" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["train/num_kept_groups"] == 4 and m["train/num_gen_batches"] >= 1
        assert m["train/num_dropped_groups"] >= 0
        assert -1.0 <= m["critic/overlong_reward/mean"] <= 0.0 and 0 <= m["critic/overlong/frac"] <= 1
        assert "critic/reward_baseline/mean" in m  # the greedy ReMax baseline was scored
        assert 0 < m["actor/tis_imp_ratio_mean"] <= 2.0 and 0 <= m["actor/tis_clipfrac"] <= 1
    state = json.loads((run_dir / "checkpoints" / "global_step_2" / "controller_state.json").read_text())
    cursor = state["data_cursor"]
    consumed = sum(m["train/num_gen_batches"] for m in steps) * 4  # gen_batch_size = train_batch_size = 4
    assert cursor["epoch"] * 200 + cursor["position"] == consumed
