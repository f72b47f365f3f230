"""A config file checked as YAML before it is loaded: one ConfigError line naming the file, the line
and the column, instead of yaml's or OmegaConf's traceback.

Deliberately not here: what the keys mean (tandem/config/load.py reads the file again, with
OmegaConf, once it is known to be a mapping).
"""
from __future__ import annotations

import yaml

from tandem.config.errors import ConfigError


def check_yaml_file(path: str) -> None:
    """ConfigError 'FILE:LINE:COLUMN: ...' when `path` cannot be read, is not valid YAML, or is not
    a mapping of sections (actor_rollout_ref:, data:, ...)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config file: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        raise ConfigError(_syntax_error(path, e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping of sections (actor_rollout_ref:, data:, ...), "
                          f"not a {'list' if isinstance(data, list) else type(data).__name__}")


def _syntax_error(path: str, e: yaml.MarkedYAMLError) -> str:
    mark = e.problem_mark or e.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = e.problem or "invalid YAML"
    if "'\\t'" in problem:  # yaml's words for a tab are obscure
        return f"{where}: YAML syntax error: a tab; YAML indents with spaces, not tabs"
    context = f" ({e.context})" if e.context and e.context not in problem else ""
    return f"{where}: YAML syntax error: {problem}{context}"
