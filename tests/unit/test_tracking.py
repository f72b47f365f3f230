"""controller.tracking sinks and controller.plot: files on disk, console without a TTY."""

from __future__ import annotations

import json
import math
import os

import pytest

from tandem.controller.plot import plot_run
from tandem.controller.tracking import Tracking


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_unknown_logger_lists_known(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\['neptune'\].*console.*jsonl.*tensorboard"):
        Tracking(str(tmp_path), ["jsonl", "neptune"], total_steps=3)


def test_jsonl_lines_read_back_equal(tmp_path) -> None:
    logged = [
        {"critic/score/mean": 0.25, "actor/pg_loss": -0.125, "response_length/mean": 7},
        {"critic/score/mean": 0.5, "val/accuracy": 0.75, "timing_s/step": 1.5},
    ]
    run_dir = tmp_path / "run"  # created by Tracking
    tracking = Tracking(str(run_dir), ["jsonl"], total_steps=2)
    tracking.log(logged[0], step=1)
    # Flushed per line: readable before close(), so a crash loses nothing.
    assert _read_jsonl(str(run_dir / "metrics.jsonl")) == [{"step": 1, **logged[0]}]
    tracking.log(logged[1], step=2)
    tracking.close()
    tracking.close()  # idempotent
    assert _read_jsonl(str(run_dir / "metrics.jsonl")) == [{"step": 1, **logged[0]}, {"step": 2, **logged[1]}]


def test_jsonl_accepts_tensor_and_numpy_scalars_rejects_others(tmp_path) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with Tracking(str(tmp_path), ["jsonl"], total_steps=1) as tracking:
        tracking.log({"a": torch.tensor(0.5), "b": np.float32(0.25)}, step=1)
        with pytest.raises(TypeError, match="metric 'c'"):
            tracking.log({"c": "high"}, step=1)
        with pytest.raises(ValueError, match="reserved"):
            tracking.log({"step": 3.0}, step=1)
    assert _read_jsonl(str(tmp_path / "metrics.jsonl")) == [{"step": 1, "a": 0.5, "b": 0.25}]


def test_tensorboard_event_file(tmp_path) -> None:
    with Tracking(str(tmp_path), ["tensorboard"], total_steps=2) as tracking:
        tracking.log({"critic/score/mean": 0.5}, step=1)
        tracking.log({"critic/score/mean": 0.75}, step=2)
    events = [f for f in os.listdir(tmp_path / "tensorboard") if f.startswith("events.out.tfevents")]
    assert len(events) == 1
    assert os.path.getsize(tmp_path / "tensorboard" / events[0]) > 0
    assert not (tmp_path / "metrics.jsonl").exists()  # only the chosen sinks write


@pytest.fixture
def no_rich_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """rich reads these to force terminal/interactive mode; CI may set them."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_console_without_tty_prints_plain_lines(tmp_path, capsys, no_rich_env) -> None:
    # Under pytest's capture, stderr is not a terminal: no live bar, one plain line per step.
    with Tracking(str(tmp_path), ["console"], total_steps=4) as tracking:
        with tracking.phase("sft [warmup]", total=10) as sft:
            for _ in range(10):
                sft.advance()
        tracking.log({"critic/score/mean": 0.5, "actor/ppo_kl": 0.001, "not/shown": 9.0}, step=1)
        tracking.log({"val/accuracy": 0.75}, step=2)
    captured = capsys.readouterr()
    assert captured.out == ""  # console goes to stderr
    lines = captured.err.splitlines()
    assert "\x1b" not in captured.err  # no ANSI escapes in CI logs
    assert lines[0] == "sft [warmup] started (10 total)"
    assert lines[-3].startswith("sft [warmup] finished 10/10")
    assert lines[-2].startswith("step 1/4 | score 0.5 | kl 0.001 | ") and "ETA" in lines[-2]
    assert "not/shown" not in captured.err
    assert lines[-1].startswith("step 2/4 | val_acc 0.75 | ")


def test_console_live_progress_bar(tmp_path, capsys, no_rich_env) -> None:
    no_rich_env.setenv("TTY_COMPATIBLE", "1")  # make rich treat captured stderr as a terminal
    no_rich_env.setenv("TTY_INTERACTIVE", "1")
    with Tracking(str(tmp_path), ["console"], total_steps=2, experiment="demo") as tracking:
        with tracking.phase("sft", total=3) as sft:
            for _ in range(3):
                sft.advance()
        tracking.log({"critic/score/mean": 0.5}, step=1)
        tracking.log({"critic/score/mean": 1.0}, step=2)
    err = capsys.readouterr().err
    assert "tandem/demo" in err and "2/2" in err  # the bar's description and M/N column
    assert "step 2/2 | score 1" in err
    assert "elapsed, ETA" not in err  # the bar shows time; the lines stay compact


def test_all_sinks_together_then_plot(tmp_path) -> None:
    with Tracking(str(tmp_path), ["console", "jsonl", "tensorboard"], total_steps=5) as tracking:
        for step in range(1, 6):
            metrics = {"critic/score/mean": step / 5, "response_length/mean": 10.0 + step}
            if step % 2 == 0:
                metrics["val/accuracy"] = step / 10
            tracking.log(metrics, step=step)
    out = plot_run(str(tmp_path / "metrics.jsonl"), str(tmp_path / "plots" / "run.png"))
    assert out == str(tmp_path / "plots" / "run.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 1000


def test_plot_subset_of_keys_and_truncated_last_line(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "val/accuracy": 0.5}\n{"step": 2, "val/accuracy": NaN}\n{"step": 3, "val/acc')
    out = plot_run(str(path), str(tmp_path / "p.png"), keys=("critic/score/mean", "val/accuracy"))
    assert os.path.getsize(out) > 0
    assert math.isnan(json.loads(path.read_text().splitlines()[1])["val/accuracy"])


def test_plot_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="metrics file not found"):
        plot_run(str(tmp_path / "missing.jsonl"), str(tmp_path / "p.png"))
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "actor/pg_loss": 0.1}\n')
    with pytest.raises(ValueError, match=r"none of \['critic/score/mean'.*keys present: \['actor/pg_loss'\]"):
        plot_run(str(path), str(tmp_path / "p.png"))
    assert not (tmp_path / "p.png").exists()
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        plot_run(str(path), str(tmp_path / "p.png"))


def test_rewind_drops_later_steps_once_each(tmp_path) -> None:
    """A run gone back to a checkpoint (crash recovery, resume after a crash): the lines of later
    steps are dropped, a torn last line too, and the steps logged again appear once."""
    t = Tracking(str(tmp_path), ["jsonl", "tensorboard"], total_steps=6)
    for step in range(6):
        t.log({"x": float(step)}, step=step)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "x": ')  # a crash mid-write
    t.rewind(3)
    t.log({"x": 40.0}, step=4)
    t.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["x"]) for m in lines] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2  # the purge starts a new file


def test_a_step_logged_again_is_merged_into_its_line(tmp_path) -> None:
    """One line per step: the final validation after the last step's line, and a restart counted at
    the step a run went back to, go into that step's line, also in a reopened (resumed) run's file."""
    t = Tracking(str(tmp_path), ["jsonl"], total_steps=3)
    for step in (1, 2, 3):
        t.log({"actor/pg_loss": float(step)}, step=step)
    t.log({"val/accuracy": 0.5}, step=3)  # the final validation
    t.rewind(2)
    t.log({"trainer/restarts": 1}, step=2)
    t.close()
    resumed = Tracking(str(tmp_path), ["jsonl"], total_steps=3)
    resumed.log({"actor/pg_loss": 30.0}, step=3)
    resumed.log({"val/accuracy": 0.75}, step=3)
    resumed.close()
    assert _read_jsonl(str(tmp_path / "metrics.jsonl")) == [
        {"step": 1, "actor/pg_loss": 1.0}, {"step": 2, "actor/pg_loss": 2.0, "trainer/restarts": 1},
        {"step": 3, "actor/pg_loss": 30.0, "val/accuracy": 0.75}]
