"""verl's custom reward function file (`custom_reward_function.path` / `.name`) imported and its
function taken, or a ValueError naming the config key: the reward service's load (in each of its
pool processes) and `tandem run`'s check before anything starts share this one definition.

Deliberately not here: which directories a service may import such a file from
(tandem/serving/allowed_dirs.py), calling the function (services/reward/custom_function.py).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Callable


def load_function(path: str, name: str) -> Callable:
    """`name` from the Python file at `path`; ValueError naming the config key otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"custom_reward_function.path: {path!r} is not a file")
    spec = importlib.util.spec_from_file_location("tandem_custom_reward", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - the user's file: report whatever it raised (a sys.exit too)
        raise ValueError(f"custom_reward_function.path: importing {path!r} raised {type(e).__name__}: "
                         f"{_one_line(e)}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"custom_reward_function.name: {path!r} defines no function {name!r}")
    return fn


def _one_line(e: BaseException) -> str:
    if isinstance(e, SyntaxError):  # its str() is the message alone; where it is matters most
        return f"{e.msg} (line {e.lineno}{f', column {e.offset}' if e.offset else ''})"
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""
