"""The files a run reads, checked where the run's controller runs: each missing one is a
ConfigError naming its key.

Not part of validate(): services load a run's config too, and they read none of these files
(the controller sends them the data), so they may well be absent where a service runs.
"""
from __future__ import annotations

import os

from tandem.config.checks.files import check_data_files
from tandem.config.errors import check
from tandem.config.schema import TandemConfig


def check_paths(cfg: TandemConfig) -> None:
    """data files (present, parquet/jsonl, with the prompt and reward columns), tokenizer and
    model directories, the checkpoint to resume from."""
    check_data_files(cfg)
    m, t = cfg.actor_rollout_ref.model, cfg.trainer
    for key, path in (("actor_rollout_ref.model.path", m.path),
                      ("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path)):
        check(path is None or os.path.exists(path), key, f"{path!r} does not exist (on the controller's machine)")
    if t.resume_mode == "resume_path":
        path = t.resume_from_path
        check(os.path.isdir(path), "trainer.resume_from_path", f"{path!r} is not a directory")
