"""Checkpoints survive kill -9 mid-save, CI-sized: bench/checkpoint_kills.py with one kill of
each target (the controller's saver, the actor's rank 0, its rank 1, the critic) at a random
moment of back-to-back saves; after each, the latest complete checkpoint must load in the actor
and the critic. The bench itself runs 50 kills."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_latest_checkpoint_loads_after_kills_during_saves():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "checkpoint_kills.py"), "--kills", "4",
                           "--seed", "1"], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "4 kills during checkpoint saves: saver 1, actor 1, actor rank 1 1, critic 1" in out, out[-2000:]
    examined = int(re.search(r"latest checkpoints examined: (\d+)", out).group(1))
    assert examined >= 3, out[-2000:]  # a complete checkpoint existed (and was loaded) after most kills
    assert "unloadable latest checkpoints: 0" in out, out[-2000:]
