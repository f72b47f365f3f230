"""A checkpoint that cannot be written fails at once with a message and leaves nothing behind: a save
with less free space than it needs is refused before it writes (RESOURCE_EXHAUSTED naming the path, the
bytes needed and the bytes free), a write that fails with torch's CheckpointException (a BaseException)
removes its partial directory and says why, and the actor keeps working. Through a real in-process actor
service and the controller's own save: the status comes back at once (not at the deadline) and the
checkpoint's step directory is gone."""
import asyncio
import errno
import os
import re
import time
import traceback
import types

import pytest
from aio_server import serving
from megatron.core import dist_checkpointing
from test_actor_worker import make_worker
from torch.distributed.checkpoint.api import CheckpointException

from tandem import checkpoint, checkpoint_room
from tandem.controller import checkpointing
from tandem.controller.clients import ActorClient
from tandem.rpc.errors import ResourceExhausted
from tandem.services.actor.servicer import SERVICE, ActorServicer
from tandem.serving.worker_thread import WorkerThread


@pytest.fixture(scope="module")
def actor(megatron_dist, arithmetic_tokenizer):
    return make_worker(arithmetic_tokenizer)


def no_room_message(path, free: int) -> str:
    return rf"no room for checkpoint {re.escape(str(path))}: it needs (\d+) bytes \([\d.]+ MB\)(.*), {free} bytes"


def test_a_save_that_cannot_fit_is_refused_before_it_writes(actor, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_room, "free_bytes", lambda path: 1000)
    path = tmp_path / "global_step_1" / "actor"
    with pytest.raises(ResourceExhausted) as e:
        actor.save(str(path))
    needed = int(re.match(no_room_message(path, 1000), str(e.value)).group(1))
    assert needed > 1_000_000  # the tiny model's weights, reference and optimizer
    assert not (tmp_path / "global_step_1").exists()  # nothing was written
    monkeypatch.undo()
    saved = actor.save(str(path))
    written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(saved) for f in fs)
    assert written <= needed < 1.2 * written  # the estimate covers the save, and not by much


def failing_save(cause: BaseException):
    """dist_checkpointing.save that writes part of a file, then fails as torch's writer does."""
    def save(state, directory, *args, **kwargs):
        with open(os.path.join(directory, "__0_0.distcp"), "wb") as f:
            f.write(b"part of a shard")
        raise CheckpointException("write", {0: (cause, traceback.extract_stack())})
    return save


@pytest.mark.parametrize("cause, expected", [
    (OSError(errno.ENOSPC, "No space left on device"),
     r"\(the write failed: rank 0: OSError: \[Errno 28\] No space left on device\)"),
    (RuntimeError("a bad sector"), r"saving checkpoint .* failed: rank 0: RuntimeError: a bad sector$")],
    ids=["disk_full", "another_failure"])
def test_a_failed_write_says_why_and_leaves_no_partial_directory(actor, tmp_path, monkeypatch, cause, expected):
    monkeypatch.setattr(dist_checkpointing, "save", failing_save(cause))
    path = tmp_path / "global_step_1" / "actor"
    with pytest.raises(Exception) as e:  # noqa: B017 - which one is the point of the case
        actor.save(str(path))
    assert isinstance(e.value, ResourceExhausted if isinstance(cause, OSError) else RuntimeError)
    assert re.search(expected, str(e.value)), str(e.value)
    assert os.listdir(path.parent) == []  # no actor.tmp
    monkeypatch.undo()
    assert checkpoint.is_checkpoint(actor.save(str(path)))  # the worker saves again


def test_the_service_answers_at_once_and_the_controller_removes_the_step(actor, tmp_path, monkeypatch):
    """Through gRPC (a real ActorServicer, the controller's ActorClient and checkpointing.save)."""
    monkeypatch.setattr(dist_checkpointing, "save", failing_save(OSError(errno.ENOSPC, "No space left on device")))
    run_dir = tmp_path / "run"

    async def main():
        async with serving(tmp_path, [(SERVICE, ActorServicer(actor, WorkerThread()))]) as endpoint:
            async with ActorClient(endpoint, timeout_s=60) as client:
                t0 = time.perf_counter()
                with pytest.raises(ResourceExhausted) as e:
                    await checkpointing.save(types.SimpleNamespace(actor=client, critic=None), str(run_dir),
                                             {"global_step": 2})
                assert time.perf_counter() - t0 < 30  # an answer, not the 60 s deadline
                return str(e.value)

    message = asyncio.run(main())
    step = run_dir / "checkpoints" / "global_step_2"
    assert message.startswith("ActorService.SaveCheckpoint: ")
    assert re.search(no_room_message(step / "actor", r"\d+"), message), message
    assert not step.exists() and os.listdir(run_dir / "checkpoints") == []


def test_the_controller_checks_the_room_against_the_last_checkpoint(tmp_path, monkeypatch):
    last = tmp_path / "checkpoints" / "global_step_2"
    for part in ("actor", "critic"):
        (last / part).mkdir(parents=True)
        (last / part / checkpoint.DONE).write_text("")
        (last / part / "shard").write_bytes(b"x" * 3000)
    (last / checkpointing.STATE_FILE).write_text("{}")
    monkeypatch.setattr(checkpoint_room, "free_bytes", lambda path: 5000)
    nothing = types.SimpleNamespace(actor=None, critic=None)  # never called: refused before any RPC
    with pytest.raises(ResourceExhausted, match=re.escape(
            f"no room for checkpoint {tmp_path / 'checkpoints' / 'global_step_4'}: it needs 6002 bytes (6.0 kB) "
            "as the last one (global_step_2) did, 5000 bytes (5.0 kB) are free there")):
        asyncio.run(checkpointing.save(nothing, str(tmp_path), {"global_step": 4}))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["global_step_2"]


def test_only_the_newest_checkpoints_are_kept_once_a_newer_one_is_complete(actor, tmp_path):
    """trainer.max_ckpt_to_keep=2 through the real service: after each save the newest two complete
    checkpoints are left, each still loadable; an incomplete directory is not the pruner's to remove."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "global_step_9").mkdir(parents=True)  # a save still writing (no state file)

    async def main():
        async with serving(tmp_path, [(SERVICE, ActorServicer(actor, WorkerThread()))]) as endpoint:
            async with ActorClient(endpoint, timeout_s=60) as client:
                roles = types.SimpleNamespace(actor=client, critic=None)
                left = []
                for step in (1, 2, 3, 4):
                    await checkpointing.save(roles, str(run_dir), {"global_step": step}, keep=2)
                    left.append(sorted(os.listdir(run_dir / "checkpoints")))
                return left

    assert asyncio.run(main()) == [["global_step_1", "global_step_9"], ["global_step_1", "global_step_2", "global_step_9"],
                                   ["global_step_2", "global_step_3", "global_step_9"],
                                   ["global_step_3", "global_step_4", "global_step_9"]]
    for step in (3, 4):
        ckpt = run_dir / "checkpoints" / f"global_step_{step}"
        assert checkpointing.is_complete(str(ckpt)) and checkpoint.is_checkpoint(str(ckpt / "actor"))
    assert checkpointing.latest(str(run_dir)).endswith("global_step_4")
