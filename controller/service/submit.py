"""A submission checked before anything is queued: the config (YAML text + dotted overrides)
loads and validates, and the files it names exist here -> the run's record.

Every problem is a ConfigError naming the dotted key (unknown key, wrong type, impossible
layout, missing data file), or an InvalidArgument for a Python file named outside the directories
`tandem serve --allow-dir` allows; the servicer answers INVALID_ARGUMENT with it and queues nothing.
"""
from __future__ import annotations

import time

from tandem.config import load_config, to_yaml
from tandem.config.paths import check_paths
from tandem.controller.run_dir import new_run_id
from tandem.controller.service.records import RunRecord
from tandem.serving.allowed_dirs import check_allowed


def new_record(config_yaml: str, overrides: list[str], source: str = "",
               allow_dirs: list[str] | None = None) -> RunRecord:
    """allow_dirs: where the config may name Python files to import (`tandem serve --allow-dir`):
    one outside is InvalidArgument, and is not imported here either."""
    cfg = load_config(text=config_yaml, overrides=overrides)
    check_paths(cfg)
    if allow_dirs is not None:
        check_allowed(cfg, allow_dirs)
    return RunRecord(id=new_run_id(cfg), state="queued", config_yaml=to_yaml(cfg), created=time.time(),
                     source=source, overrides=list(overrides), experiment=cfg.trainer.experiment_name,
                     total_steps=cfg.trainer.total_training_steps)
