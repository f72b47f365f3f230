"""controller/interrupt.py: SIGTERM cancels the run as Ctrl-C does; a run that does not stop within
the deadline (here a coroutine that swallows its cancellation) exits with 130 anyway, after
printing where it was."""
import signal
import subprocess
import sys
import time

SCRIPT = """
import asyncio, sys
from tandem.controller import interrupt

async def run(swallow):
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if not swallow:
                raise
            print("swallowed", flush=True)

interrupt.install(deadline_s=2.0)
print("ready", flush=True)
try:
    asyncio.run(run(sys.argv[1] == "swallow"))
except KeyboardInterrupt:
    print("cancelled", flush=True)
    sys.exit(130)
"""


def _term(mode: str) -> tuple[subprocess.CompletedProcess, float]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # inside asyncio.run
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - t0


def test_sigterm_cancels_the_run_as_ctrl_c_does():
    done, _ = _term("cancel")
    assert done.returncode == 130 and "cancelled" in done.stdout, done
    assert "did not stop" not in done.stderr


def test_a_run_that_swallows_its_cancellation_still_exits_after_the_deadline():
    done, waited = _term("swallow")
    assert "swallowed" in done.stdout and "cancelled" not in done.stdout, done  # control: it did not stop
    assert done.returncode == 130, done
    assert waited >= 2.0
    assert "did not stop within 2 s of SIGTERM" in done.stderr
    assert "in run" in done.stderr  # the task's stack: where the run was
    assert "exiting without the cleanup" in done.stderr


def test_sigusr1_prints_every_threads_stack_and_the_run_goes_on():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "cancel"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    assert proc.poll() is None  # still running
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "Current thread" in err and 'File "<string>"' in err, err  # the dump, main thread included
    assert proc.returncode == 130 and "cancelled" in out
