"""HostStash (tensors' storage to host memory and back) and MemoryPhases (which group moves when),
without a model: bookkeeping, identity of the tensors, nothing lost, and the phase rules. The stash's
tensors live on this process's device: on a GPU its copies run on the side stream, into pinned memory."""
import pytest
import torch

from tandem.parallel import device
from tandem.train.offload import HostStash, distinct_storages
from tandem.train.phases import IDLE, MemoryPhases, StateGroup


def randn(*shape) -> torch.Tensor:
    return torch.randn(*shape, device=device.device())


def test_stash_frees_the_storage_keeps_the_tensors_and_gives_the_bytes_back():
    a = torch.nn.Parameter(randn(4, 3))
    b = randn(5)
    view = a.detach().view(-1)[2:7]  # shares a's storage
    want = {"a": a.detach().clone(), "b": b.clone(), "view": view.clone()}
    stash = HostStash()
    storages = distinct_storages([a, b, view, a])
    assert len(storages) == 2  # a, its view and its repeat are one storage
    assert stash.offload(storages) == (12 + 5) * 4 == stash.nbytes_on_host
    assert a.untyped_storage().nbytes() == 0 and b.untyped_storage().nbytes() == 0
    assert view.untyped_storage().nbytes() == 0
    assert distinct_storages([a, b]) == []  # stashed storages are not taken twice
    assert stash.reload() == 17 * 4 and stash.nbytes_on_host == 0
    assert torch.equal(a.detach(), want["a"]) and torch.equal(b, want["b"]) and torch.equal(view, want["view"])
    assert stash.reload() == 0  # nothing held


def test_stash_reuses_its_host_buffers_and_excludes_what_it_is_told():
    t, keep = randn(8), randn(8)
    stash = HostStash()
    stash.offload(distinct_storages([t, keep], exclude=[keep]))
    assert keep.untyped_storage().nbytes() == 32 and t.untyped_storage().nbytes() == 0
    stash.reload()
    first = stash._mirror[t.untyped_storage().data_ptr()]
    t.mul_(2)  # the tensor changes on the device; the next offload carries the new values
    want = t.clone()
    assert stash.offload(distinct_storages([t])) == 32
    assert stash._held[0][1] is first  # the same host buffer, not a new one
    stash.reload()
    assert torch.equal(t, want)
    stash.free_host_memory()
    assert not stash._spare and not stash._mirror


def test_an_unchanged_storage_leaves_without_a_copy_and_comes_back_the_same():
    t, u = randn(8), randn(4)
    want = (t.clone(), u.clone())
    stash = HostStash()
    assert stash.offload(distinct_storages([t, u]), unchanged=True) == 48  # never reloaded: nothing to reuse
    stash.reload()
    assert stash.offload(distinct_storages([t, u]), unchanged=True) == 0  # the host still has both
    assert t.untyped_storage().nbytes() == 0 and stash.nbytes_on_host == 48
    stash.reload()
    assert torch.equal(t, want[0]) and torch.equal(u, want[1])
    u.add_(1)  # written: its owner must not say unchanged, and without it everything is copied
    assert stash.offload(distinct_storages([t, u])) == 48
    stash.reload()
    assert torch.equal(u, want[1] + 1)
    stash.drop()
    assert not stash._mirror


class Recorder:
    def __init__(self):
        self.calls = []

    def group(self, name, offload):
        return StateGroup(name, offload, move_out=lambda: self.calls.append(("out", name)),
                          move_in=lambda: self.calls.append(("in", name)))


PHASES = {"generate": {"policy", "kv"}, "log_probs": {"policy"}, "ref_log_probs": {"ref"},
          "train": {"policy", "grads", "optimizer"}}


def phases(offload: set, idle_after_call=False):
    rec = Recorder()
    memory = MemoryPhases(PHASES, idle_after_call=idle_after_call)
    for name in ("policy", "grads", "optimizer", "ref", "kv"):
        memory.add(rec.group(name, name in offload))
    return memory, rec


def test_a_phase_moves_out_what_it_does_not_use_then_moves_in_what_it_uses():
    memory, rec = phases({"policy", "grads", "optimizer", "ref", "kv"})
    memory.enter("generate")
    assert rec.calls == [("out", "grads"), ("out", "optimizer"), ("out", "ref")]
    assert memory.where() == {"policy": "device", "grads": "host", "optimizer": "host", "ref": "host", "kv": "device"}
    rec.calls.clear()
    memory.enter("log_probs")  # the policy stays: consecutive calls that use it move nothing
    assert rec.calls == [("out", "kv")]
    rec.calls.clear()
    memory.enter("ref_log_probs")
    assert rec.calls == [("out", "policy"), ("in", "ref")]
    rec.calls.clear()
    memory.enter("train")  # room first, then what training uses
    assert rec.calls == [("out", "ref"), ("in", "policy"), ("in", "grads"), ("in", "optimizer")]
    assert memory.current == "train"


def test_a_group_only_read_since_it_came_in_leaves_the_cheap_way():
    rec = Recorder()
    memory = MemoryPhases(PHASES, reads_only={"ref_log_probs": {"ref"}})
    for name in ("policy", "ref"):
        g = memory.add(rec.group(name, True))
        g.unchanged_out = lambda name=name: rec.calls.append(("out unchanged", name))
    memory.enter("train")
    memory.enter("ref_log_probs")
    memory.enter("train")  # the reference was only read: its host copy is still good
    memory.enter("ref_log_probs")  # the policy was trained: copied out
    memory.uses["checkpoint"] = {"policy", "ref"}
    memory.enter("checkpoint")  # may write the reference (reference := policy)
    memory.enter("generate")
    assert rec.calls == [("out", "ref"), ("out", "policy"), ("in", "ref"), ("out unchanged", "ref"), ("in", "policy"),
                         ("out", "policy"), ("in", "ref"), ("in", "policy"), ("out", "ref")]


def test_a_prefetched_group_is_waited_for_by_the_phase_that_uses_it_and_leaves_unchanged():
    rec = Recorder()
    memory = MemoryPhases(PHASES, reads_only={"ref_log_probs": {"ref"}})
    memory.add(rec.group("policy", False))
    ref = memory.add(rec.group("ref", True))
    ref.start_in = lambda: rec.calls.append(("start in", "ref"))
    ref.ready = lambda: rec.calls.append(("wait", "ref"))
    ref.unchanged_out = lambda: rec.calls.append(("out unchanged", "ref"))
    memory.enter("train")
    memory.prefetch("policy")  # on the device: nothing to do
    with memory.phase("log_probs"):
        memory.prefetch("ref")  # the copies start beside the old log-prob pass
        assert memory.where()["ref"] == "device" and rec.calls == [("out", "ref"), ("start in", "ref")]
        memory.enter("ref_log_probs")  # no second move in: a device-side wait
        memory.enter("ref_log_probs")  # waited once
    memory.enter("train")
    memory.prefetch("ref")
    memory.enter("generate")  # prefetched but not used: it leaves again, never waited for
    memory.enter("ref_log_probs")
    assert rec.calls == [("out", "ref"), ("start in", "ref"), ("wait", "ref"), ("out unchanged", "ref"),
                         ("start in", "ref"), ("out unchanged", "ref"), ("in", "ref")]
    ref.start_in = None  # a group that cannot move in asynchronously comes in with its phase
    memory.enter("train")
    memory.prefetch("ref")
    assert memory.where()["ref"] == "host"


def test_groups_whose_key_is_off_never_leave():
    memory, rec = phases({"ref"})
    for phase in ("generate", "train", "log_probs", "ref_log_probs", "generate"):
        memory.enter(phase)
    assert rec.calls == [("out", "ref"), ("in", "ref"), ("out", "ref")]
    assert memory.where()["optimizer"] == "device" and memory.where()["grads"] == "device"


def test_idle_after_call_and_the_hook_before_a_group_leaves():
    memory, rec = phases({"policy", "optimizer"}, idle_after_call=True)
    memory.groups["policy"].before_out.append(lambda: rec.calls.append(("release", "engine")))
    with memory.phase("train"):
        assert memory.current == "train"
    assert memory.current == IDLE
    assert rec.calls == [("release", "engine"), ("out", "policy"), ("out", "optimizer")]
    with pytest.raises(ValueError, match="unknown phase 'sleep'"):
        memory.enter("sleep")
    with pytest.raises(ValueError, match="already registered"):
        memory.add(rec.group("policy", True))
