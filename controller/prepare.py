"""`python -m tandem.controller.prepare SPEC_DIR [CONFIG.yaml] [key=value ...]`: a run's inputs, before any service.

Writes SPEC_DIR/config.yaml (the resolved config) and, when the config names none, the built-in
task's tokenizer and data beside it. Services that are started before the controller (compose
starts every container at once) need their config first: they start from SPEC_DIR/config.yaml,
and so does the controller (`tandem run SPEC_DIR/config.yaml`, which then makes its own run
directory under trainer.default_local_dir for metrics, logs and checkpoints, with the same
tokenizer and data). Overrides also come from $TANDEM_OVERRIDES (shell words, after the command
line's), so a compose file can pass a user's settings through one variable.

Deliberately not here: running anything (controller/run.py). This step goes away once services
receive their config from the controller instead of a file.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys

from tandem.controller.run_dir import CONFIG_FILE, materialise


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    spec_dir = os.path.abspath(args.pop(0))
    config_path = args.pop(0) if args and "=" not in args[0] else None
    overrides = args + shlex.split(os.environ.get("TANDEM_OVERRIDES", ""))
    from tandem.config import ConfigError, load_config

    try:
        cfg = load_config(config_path, overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"tandem prepare: config error: {e}", file=sys.stderr)
        return 2
    for stale in ("tokenizer", "data"):  # a second `compose up` on the same volume starts afresh
        shutil.rmtree(os.path.join(spec_dir, stale), ignore_errors=True)
    os.makedirs(spec_dir, exist_ok=True)
    materialise(cfg, spec_dir)
    print(f"tandem prepare: wrote {os.path.join(spec_dir, CONFIG_FILE)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
