"""A service that did not start, told in one line: its own last error first, then how it ended and
where its log is (not 50 lines of the controller's traceback with the service's reason last).

`last_error` reads the service's log: the exception line that ends its last Python traceback,
else its last structlog line at error level, else its last line of plain text (argparse's
"prog: error: ..."). Every launcher that starts processes raises `ServiceStartFailed`, and tells
how a service process ended with `how_it_ended`.
"""
from __future__ import annotations

import json
import signal

TAIL_LINES = 400  # a start-up traceback and what the service logged just before it


class ServiceStartFailed(RuntimeError):
    """A service exited, or did not serve in time, while starting."""


def _tail(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-TAIL_LINES:]]
    except OSError:
        return []


def _traceback_error(lines: list[str]) -> str | None:
    """The exception line of the last traceback: its first unindented line after the header."""
    found, inside = None, False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            inside = True
        elif inside and line and not line[0].isspace():
            found, inside = line.strip(), False
    return found


def _logged_error(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") in ("error", "critical"):
            detail = event.get("error") or event.get("exception") or ""
            return f"{event.get('event')}: {str(detail).strip().splitlines()[-1] if detail else ''}".rstrip(": ")
    return None


def last_error(log_path: str) -> str:
    """The service's own last error, one line (see the module docstring)."""
    lines = _tail(log_path)
    error = _traceback_error(lines) or _logged_error(lines)
    if error is None:
        error = next((x.strip() for x in reversed(lines) if x.strip() and not x.startswith("{")), None)
    return error or "its log shows no error"


def how_it_ended(returncode: int) -> str:
    """'killed by SIGKILL', 'exited with code 3' (a Popen returncode: negative for a signal)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def start_failed(role: str, how: str, log_path: str) -> ServiceStartFailed:
    """'the <role> service failed to start: <its last error>' and, on a second line, how it ended
    and its log."""
    return ServiceStartFailed(f"the {role} service failed to start: {last_error(log_path)}\n"
                              f"  ({how}; its log: {log_path})")
