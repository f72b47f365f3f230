"""The files a run reads, checked where the run's controller runs: each missing one is a
ConfigError naming its key.

Not part of validate(): services load a run's config too, and they read none of these files
(the controller sends them the data), so they may well be absent where a service runs.
"""
from __future__ import annotations

import os

from tandem.config.checks.files import check_data_files
from tandem.config.errors import ConfigError, check, raise_all
from tandem.config.schema import TandemConfig


def _check_model_dirs(cfg: TandemConfig) -> None:
    m = cfg.actor_rollout_ref.model
    for key, path in (("actor_rollout_ref.model.path", m.path),
                      ("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path)):
        check(path is None or os.path.exists(path), key, f"{path!r} does not exist (on the controller's machine)")


def _check_resume_path(cfg: TandemConfig) -> None:
    t = cfg.trainer
    if t.resume_mode == "resume_path":
        check(os.path.isdir(t.resume_from_path), "trainer.resume_from_path", f"{t.resume_from_path!r} is not a directory")


def path_problems(cfg: TandemConfig) -> list[str]:
    """The first bad file of each kind (data files, model and tokenizer directories, the checkpoint
    to resume from), "<dotted key>: <why>" each."""
    found = []
    for check_one in (check_data_files, _check_model_dirs, _check_resume_path):
        try:
            check_one(cfg)
        except ConfigError as e:
            found.append(str(e))
    return found


def check_paths(cfg: TandemConfig) -> None:
    """data files (present, parquet/jsonl, with the prompt and reward columns), tokenizer and
    model directories, the checkpoint to resume from."""
    raise_all(path_problems(cfg))
