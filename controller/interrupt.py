"""SIGTERM for `tandem run` (kill, docker stop, a batch scheduler): stop as Ctrl-C does, within a deadline.

The signal becomes SIGINT, so asyncio cancels the run and the launcher's cleanup stops the services
it started; the run's cancel flag is set too (`when_requested`), so the run also stops at its next
step should the cancellation be lost (a task cancelled just as the call it awaited finished returns
that call's result, and the task awaiting it goes on as if nothing happened). Should the run still be going `deadline_s` later (a cancellation swallowed, a call that
never returns), the process prints where each thread and task was and exits with 130 anyway: the
services it started stop themselves once it is gone (TANDEM_PARENT_PID, tandem/rpc/server.py).

Deliberately not here: the cleanup itself (controller/run.py's `execute`, the launchers' `stop`).
"""
from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable

DEADLINE_S = 30.0  # a normal stop: the call in flight cancelled, then the services' 10 s grace
_on_request: list[Callable[[], None]] = []


def when_requested(fn: Callable[[], None]) -> None:
    """Call `fn` (thread-safe, quick: e.g. a run's CancelFlag.set) when SIGTERM comes."""
    _on_request.append(fn)


def install(deadline_s: float = DEADLINE_S) -> None:
    """Handle SIGTERM as above, and SIGUSR1 as a stack dump (main thread, before asyncio.run)."""
    armed: list[threading.Timer] = []

    def on_sigterm(*_) -> None:
        if not armed:
            try:
                loop = asyncio.get_running_loop()  # the handler runs on the loop's (main) thread
            except RuntimeError:  # before asyncio.run started
                loop = None
            timer = threading.Timer(deadline_s, _force_exit, (deadline_s, loop))
            timer.daemon = True
            timer.start()
            armed.append(timer)
            for fn in _on_request:
                fn()
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGTERM, on_sigterm)
    # `kill -USR1 PID`: every thread's Python stack on stderr, printed by the C handler (a main thread
    # stuck in C code is seen too), and the run goes on
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def _force_exit(deadline_s: float, loop: asyncio.AbstractEventLoop | None) -> None:
    print(f"tandem: the run did not stop within {deadline_s:g} s of SIGTERM; where it was:", file=sys.stderr,
          flush=True)
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if loop is not None:
            for task in list(asyncio.all_tasks(loop)):
                task.print_stack(file=sys.stderr)
    except Exception:  # noqa: BLE001 - the tasks change under us (read from this thread); exit whatever happens
        pass
    finally:
        print("tandem: interrupted; exiting without the cleanup (the services stop themselves once this "
              "process is gone)", file=sys.stderr, flush=True)
        os._exit(130)
