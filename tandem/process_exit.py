"""End a process that imported torch and megatron-core without the interpreter's teardown.

Python's shutdown runs a full garbage collection over every object the imports made (torch,
megatron-core, transformers, triton: about half a million), which takes seconds for each service,
rank and controller that stops, and makes triton's bindings print leak reports. Nothing of ours
needs that teardown: `exit_process` runs the atexit handlers (open files, trackers and
torch.distributed's own), flushes the standard streams and logging, then ends the process.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn


def exit_process(code: int | None = 0) -> NoReturn:
    """sys.exit(code) without the final collection: for the end of a process's main."""
    code = 0 if code is None else int(code)
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 (what the interpreter's own exit runs first)
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or replaced stream
                pass
        os._exit(code)
