"""Continuous-batching scheduler against a fake runner (no model, no tensors)."""
import random

import pytest

from tandem.generation.scheduler import Plan, Scheduler, round_up


class FakeRunner:
    """Plays the device: row r stops after lengths[r] tokens (<= max_new_tokens)."""

    def __init__(self, num_slots, n, lengths, max_new_tokens):
        self.n, self.lengths, self.r = n, lengths, max_new_tokens
        self.slot_row = [None] * num_slots
        self.made = {}  # row -> tokens generated so far
        self.log = []

    def execute(self, sched: Scheduler, plan: Plan) -> list[bool]:
        self.log.append(plan)
        for a in plan.admit:
            assert len(a.slots) == self.n and len(set(a.slots)) == self.n
            for j, s in enumerate(a.slots):
                assert self.slot_row[s] is None, f"slot {s} admitted while busy"
                row = a.prompt * self.n + j
                assert row not in self.made, f"row {row} admitted twice"
                self.slot_row[s] = row
                self.made[row] = 1  # the prefill samples the first token
        busy = [s for s, r in enumerate(self.slot_row) if r is not None]
        if plan.decode_steps:
            assert max(busy) < plan.batch, "a busy slot is outside the decoded batch"
            assert plan.decode_steps <= sched.sync_every
        for s in busy:
            row = self.slot_row[s]
            self.made[row] = min(self.lengths[row], self.made[row] + plan.decode_steps)
        alive = [False] * len(self.slot_row)
        for s in busy:
            row = self.slot_row[s]
            alive[s] = self.made[row] < self.lengths[row]
        return alive

    def finished(self, rows):
        for s, r in enumerate(self.slot_row):
            if r in rows:
                self.slot_row[s] = None


def run(sched, runner):
    finished_order = []
    while (plan := sched.schedule()) is not None:
        alive = runner.execute(sched, plan)
        done = sched.update(plan, alive)
        runner.finished(set(done))
        finished_order += done
    return finished_order


@pytest.mark.parametrize("sync_every", [1, 4])
def test_every_row_runs_once_to_its_length_with_refill(sync_every):
    rng = random.Random(0)
    prompts, n, r, slots = 9, 2, 12, 6
    prompt_lens = [rng.randint(1, 7) for _ in range(prompts)]
    lengths = [rng.randint(1, r) for _ in range(prompts * n)]
    sched = Scheduler(prompt_lens, n, r, num_slots=slots, max_len=32, sync_every=sync_every,
                      batch_buckets=[2, 4], kv_bucket=8)
    runner = FakeRunner(slots, n, lengths, r)
    finished = run(sched, runner)
    assert sorted(finished) == list(range(prompts * n))  # every row finishes exactly once
    assert all(runner.made[row] == lengths[row] for row in range(prompts * n))
    # continuous batching: some prompt is admitted while other rows are still decoding
    admitted_late = [p for p in runner.log[1:] if p.admit]
    assert admitted_late and any(p.decode_steps for p in admitted_late)
    # the n samples of a prompt are admitted together (one prefill) in prompt order
    order = [a.prompt for p in runner.log for a in p.admit]
    assert order == list(range(prompts))


def test_plan_shapes_are_buckets_and_cover_the_positions():
    prompt_lens, n, r = [5, 3, 20], 1, 10
    sched = Scheduler(prompt_lens, n, r, num_slots=3, max_len=32, sync_every=4,
                      batch_buckets=[1, 2], kv_bucket=8)
    plan = sched.schedule()
    assert [a.slots for a in plan.admit] == [(0,), (1,), (2,)]
    assert plan.decode_steps == 4 and plan.batch == 3
    # longest prompt 20 + 4 steps: positions 20..23 are written -> kv_len 24 (bucket of 8)
    assert plan.kv_len == 24
    positions = {0: 5, 1: 3, 2: 20}
    sched.update(plan, [True, False, True])  # slot 1 stopped
    assert sched.busy_rows() == {0: 0, 2: 2}
    plan = sched.schedule()
    assert plan.admit == () and plan.batch == 3 and plan.kv_len == 32
    sched.update(plan, [True, False, False])
    plan = sched.schedule()
    # only slot 0 left: the smallest bucket that covers it, kv over 5 + 8 + 1 positions
    assert plan.batch == 1 and plan.decode_steps == 1 and plan.kv_len == 16
    assert positions[0] + 8 + plan.decode_steps <= plan.kv_len
    sched.update(plan, [False, False, False])
    assert sched.schedule() is None and sched.done


def test_max_new_tokens_1_is_prefill_only():
    sched = Scheduler([4, 4], 2, 1, num_slots=4, max_len=8)
    plan = sched.schedule()
    assert len(plan.admit) == 2 and plan.decode_steps == 0
    assert sorted(sched.update(plan, [True] * 4)) == [0, 1, 2, 3]  # done by length
    assert sched.schedule() is None


def test_waits_for_n_free_slots():
    sched = Scheduler([2, 2], 3, 5, num_slots=4, max_len=8)
    plan = sched.schedule()
    assert [a.prompt for a in plan.admit] == [0]  # 1 free slot < n = 3: prompt 1 waits
    sched.update(plan, [False, True, True, False])
    plan = sched.schedule()
    assert plan.admit == ()  # still only 2 free slots
    sched.update(plan, [False, False, False, False])
    plan = sched.schedule()
    assert [(a.prompt, a.slots) for a in plan.admit] == [(1, (0, 1, 2))]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n=4"):
        Scheduler([3], 4, 5, num_slots=2, max_len=16)
    with pytest.raises(ValueError, match="max_len 8"):
        Scheduler([5], 1, 4, num_slots=2, max_len=8)


def test_round_up():
    assert [round_up(v, [2, 4, 8]) for v in (1, 2, 3, 5, 8)] == [2, 2, 4, 8, 8]


def test_all_prompts_that_fit_are_admitted_at_once():
    """256 slots, 256 long prompts: one admission round, then full-batch windows only
    (admitting in small rounds would decode the first windows at a fraction of the batch)."""
    sched = Scheduler([512] * 256, 1, 512, num_slots=256, max_len=1024, sync_every=16,
                      batch_buckets=[8, 16, 32, 64, 128], kv_bucket=128)
    plans = []
    while (plan := sched.schedule()) is not None:
        plans.append(plan)
        sched.update(plan, [True] * 256)
    assert len(plans[0].admit) == 256 and all(not p.admit for p in plans[1:])
    assert len(plans) == 32 and {p.batch for p in plans} == {256}
    assert [p.kv_len for p in plans[::8]] == [640, 768, 896, 1024]


def test_a_paused_row_keeps_its_slot_out_of_the_plans_until_it_resumes():
    """Multi-turn: a row waiting on a tool holds its slot (no admission into it, no decode for it);
    with nothing else to run the scheduler is stalled; resumed, it decodes from its new position."""
    sched = Scheduler([3, 2], n=1, max_new_tokens=10, num_slots=2, max_len=16)
    plan = sched.schedule()
    assert [a.slots for a in plan.admit] == [(0,), (1,)]
    sched.update(plan, [False, True], paused=frozenset({0}))  # row 0 stopped on a tool call
    assert sched.busy_rows() == {1: 1} and not sched.stalled
    plan = sched.schedule()
    assert plan.admit == () and plan.batch == 2
    assert sched.update(plan, [False, False]) == [1]  # row 1 finished; row 0 still waits
    assert sched.stalled and not sched.done
    assert sched.resume(0, next_index=5, alive=True) == []  # call + observation: 4 tokens after index 1
    assert not sched.stalled and sched.busy_rows() == {0: 0}
    plan = sched.schedule()
    assert plan.decode_steps == 1  # sync_every
    assert (sched._busy[0].position, sched._busy[0].steps_left) == (3 + 5, 10 - 1 - 5)
    assert sched.update(plan, [False, False]) == [0] and sched.done
