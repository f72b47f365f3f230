"""CallObserver (tandem/serving/call_observer.py) in one process: traces only for the chosen
steps of a chosen rank, one file per step, and a compile.spent line only after a call that compiled."""
import json
import os

import torch
from structlog.testing import capture_logs

from tandem.config.schema import ProfileConfig
from tandem.serving.call_observer import CallObserver


def _work():
    torch.ones(64, 64) @ torch.ones(64, 64)


def test_traces_for_the_chosen_steps_only(tmp_path):
    profile = ProfileConfig(use_profile=True, profile_ranks=[0], step_start=2, step_end=4, save_path=str(tmp_path))
    obs = CallObserver("actor", 0, profile)
    for step in (None, 1, 2, 2, 3, 4):
        with obs.call(step, "actor.update"):
            _work()
    obs.close()
    assert sorted(os.listdir(tmp_path)) == ["actor_rank0_step2.json", "actor_rank0_step3.json"]
    step2 = json.loads((tmp_path / "actor_rank0_step2.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "actor.update" for e in step2) == 2  # both calls of step 2, one range each
    other_rank = CallObserver("actor", 1, profile)
    with other_rank.call(2, "actor.update"):
        _work()
    other_rank.close()
    assert not os.path.exists(tmp_path / "actor_rank1_step2.json")


def test_compile_time_is_logged_after_a_call_that_compiled():
    obs = CallObserver("actor", 0, None)
    fn = torch.compile(lambda x: torch.sin(x) * 2, backend="eager")
    with capture_logs() as logs:
        with obs.call(1, "actor.update"):
            fn(torch.ones(8))
        with obs.call(1, "actor.update"):
            fn(torch.ones(8))  # compiled already
    spent = [e for e in logs if e["event"] == "compile.spent"]
    assert len(spent) == 1 and spent[0]["rl_step"] == 1 and spent[0]["compile_s"] > 0
    # torch's split of it: the whole frame took the time (the eager backend compiles nothing itself)
    assert spent[0]["frame_s"] > 0 and spent[0]["frame_s"] <= spent[0]["compile_s"] + 1e-3
    assert 0 <= spent[0]["backend_s"] <= spent[0]["frame_s"]


def test_compile_spent_says_how_the_on_disk_cache_answered(tmp_path, monkeypatch):
    """A first inductor compile misses the FX graph cache; the same graph compiled again (dynamo's
    in-memory state reset) is read back from disk: a hit, logged as such."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    obs = CallObserver("actor", 0, None)

    def fn(x):
        return torch.cos(x) * 3 + 1

    spent = []
    for _ in range(2):
        torch._dynamo.reset()
        with capture_logs() as logs:
            with obs.call(1, "actor.update"):
                torch.compile(fn)(torch.ones(8))
        spent += [e for e in logs if e["event"] == "compile.spent"]
    assert [s.get("fx_cache_miss", 0) for s in spent] == [1, 0]
    assert [s.get("fx_cache_hit", 0) for s in spent] == [0, 1]
    assert all(isinstance(s["compile_pool_up"], bool) and s["compile_threads"] >= 1 for s in spent)


def test_a_full_collection_inside_a_call_is_logged():
    import gc

    obs = CallObserver("actor", 0, None)
    with capture_logs() as logs:
        with obs.call(2, "actor.compute_log_prob"):
            gc.collect()  # generation 2: every tracked object scanned
        with obs.call(2, "actor.compute_log_prob"):
            _work()  # a call without a collection worth a line (allocations this small start none)
    paused = [e for e in logs if e["event"] == "gc.paused"]
    assert len(paused) == 1 and paused[0]["rl_step"] == 2 and paused[0]["method"] == "actor.compute_log_prob"
    assert paused[0]["full"] == 1 and paused[0]["collections"] >= 1
    assert 0 < paused[0]["full_s"] <= paused[0]["gc_s"]

