"""Run records in SQLite: states move only along the allowed edges, events come back in order
from a step or after a seq, a resumed run's redone steps win, and a reopened file has it all.
The restart policy (`recover`) on records left running."""
import time

import pytest

from tandem.config import load_config, to_yaml
from tandem.controller.service.queue import recover
from tandem.controller.service.records import Records, RunRecord


def record(run_id: str, created: float, **overrides) -> RunRecord:
    cfg = load_config(None, [f"trainer.{k}={v}" for k, v in overrides.items()])
    return RunRecord(id=run_id, state="queued", config_yaml=to_yaml(cfg), created=created, total_steps=5)


def test_states_events_and_reopening(tmp_path):
    db = Records(str(tmp_path))
    db.add(record("r1", 1.0))
    db.add(record("r2", 2.0))
    assert db.next_queued().id == "r1" and [r.id for r in db.list()] == ["r2", "r1"]
    assert db.set_state("r1", "running", only_from=("queued",))
    assert not db.set_state("r1", "running", only_from=("queued",))  # already running
    assert db.next_queued().id == "r2"
    db.metrics("r1", 1, {"critic/score/mean": 0.25})
    db.log("r1", 1, "step 1/5")
    db.metrics("r1", 2, {"critic/score/mean": 0.5})
    db.metrics("r1", 2, {"val/accuracy": 0.75})  # the step's validation, logged after it
    db.metrics("r1", 2, {"critic/score/mean": 0.625})  # redone after a resume: the later one wins
    assert db.get("r1").last_step == 2
    assert db.latest_metrics("r1") == (2, {"critic/score/mean": 0.625, "val/accuracy": 0.75})
    assert db.step_metrics("r1") == {1: {"critic/score/mean": 0.25},
                                     2: {"critic/score/mean": 0.625, "val/accuracy": 0.75}}
    events = db.events("r1")
    assert [e.kind for e in events] == ["log", "state", "metrics", "log", "metrics", "metrics", "metrics"]
    assert [e.seq for e in db.events("r1", from_step=2)] == [e.seq for e in events[4:]]
    assert [e.seq for e in db.events("r1", after_seq=events[3].seq)] == [e.seq for e in events[4:]]
    assert db.set_state("r1", "succeeded", only_from=("running",), summary_json='{"rl_gain": 0.1}')
    r1 = db.get("r1")
    assert r1.ended and r1.finished >= r1.started > 0
    with pytest.raises(ValueError, match="unknown run state"):
        db.set_state("r2", "paused")
    db.close()

    again = Records(str(tmp_path))  # the same file, as a restarted controller opens it
    assert again.get("r1").summary_json == '{"rl_gain": 0.1}' and again.get("r2").state == "queued"
    assert [e.seq for e in again.events("r1")] == [e.seq for e in events] + [again.events("r1")[-1].seq]


def test_recover_follows_each_runs_restart_policy(tmp_path):
    db = Records(str(tmp_path))
    run_dir = tmp_path / "resumable"
    ckpt = run_dir / "checkpoints" / "global_step_3"
    (ckpt / "actor").mkdir(parents=True)
    (ckpt / "actor" / "tandem_complete").write_text("")  # a complete part (controller/checkpointing.is_complete)
    (ckpt / "controller_state.json").write_text('{"global_step": 3}')
    now = time.time()
    for rid, kw in (("resume", {}), ("fresh", {}), ("fail", {"on_controller_restart": "fail"}), ("queued", {})):
        db.add(record(rid, now, **kw))
    for rid in ("resume", "fresh", "fail"):
        db.set_state(rid, "running")
    db.update("resume", run_dir=str(run_dir))
    assert recover(db) == {"resume": "resumed", "fresh": "restarted", "fail": "failed"}
    assert db.get("resume").state == "queued" and db.get("resume").resume_from == str(ckpt)
    assert db.get("fresh").state == "queued" and db.get("fresh").resume_from == ""
    assert db.get("fail").state == "failed" and "controller restarted" in db.get("fail").error
    assert db.get("queued").state == "queued"
