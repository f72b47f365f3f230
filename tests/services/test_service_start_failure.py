"""A service that fails while starting is reported in one line, its own last error first, then how it
ended and where its log is: a real reward service started by the local launcher (as `tandem run` starts
it) from a config whose reward function raises on import. And `last_error` on the log shapes a service
leaves: a traceback among structlog lines, an error logged as JSON, argparse's error line."""
import asyncio
import json

import pytest

from tandem.config import load_config, to_yaml
from tandem.controller.launchers import LaunchContext
from tandem.controller.launchers.local import LocalLauncher
from tandem.controller.launchers.start_failure import ServiceStartFailed, last_error


def test_a_service_that_fails_to_start_says_why_first(tmp_path):
    (tmp_path / "reward.py").write_text("1 / 0\n")
    cfg = load_config(None, [f"custom_reward_function.path={tmp_path / 'reward.py'}"])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    launcher = LocalLauncher(LaunchContext(str(tmp_path / "config.yaml"), str(tmp_path), "start-failure", 120, cfg=cfg))
    try:
        with pytest.raises(ServiceStartFailed) as e:
            asyncio.run(launcher.start(["reward"]))
    finally:
        launcher.stop()
    log = tmp_path / "logs" / "reward.log"
    assert str(e.value).splitlines() == [
        f"the reward service failed to start: ValueError: custom_reward_function.path: importing "
        f"'{tmp_path / 'reward.py'}' raised ZeroDivisionError: division by zero",
        f"  (exited with code 1; its log: {log})"]
    assert "Traceback (most recent call last):" in log.read_text()  # the whole story stays in the log


def test_last_error_reads_the_shapes_a_log_takes(tmp_path):
    log = tmp_path / "a.log"
    info = json.dumps({"event": "service.process", "level": "info"})
    log.write_text("\n".join([
        info, "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
        "KeyError: 'first'", "", "During handling of the above exception, another exception occurred:", "",
        "Traceback (most recent call last):", '  File "y.py", line 2, in <module>',
        "OSError: [Errno 98] Address already in use", "  with a second line", info]) + "\n")
    assert last_error(str(log)) == "OSError: [Errno 98] Address already in use"
    log.write_text("\n".join([info, json.dumps({"event": "service.rank_lost", "level": "error",
                                                "error": "Connection closed by peer"}), info]) + "\n")
    assert last_error(str(log)) == "service.rank_lost: Connection closed by peer"
    log.write_text("usage: python -m tandem.services.reward [-h] ...\n"
                   "python -m tandem.services.reward: error: --host 0.0.0.0 serves beyond loopback\n")
    assert last_error(str(log)) == "python -m tandem.services.reward: error: --host 0.0.0.0 serves beyond loopback"
    assert last_error(str(tmp_path / "none.log")) == "its log shows no error"
